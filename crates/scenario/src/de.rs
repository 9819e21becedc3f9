//! Typed structs from a [`Node`] tree, with an error that always knows where it is.
//!
//! This is a small serde `Deserializer` over the tree built by [`crate::node`]. It is
//! strict where YAML is loose: a string is never read as a number or the reverse, a
//! mapping is required where a struct is expected, and an unknown key is an error that
//! names the key's own line and column and suggests the closest known one.
//! [`Located<T>`] captures the position of any value for later checks.

use std::fmt;

use schemars::JsonSchema;
use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, VariantAccess, Visitor,
};

use crate::node::{Key, Node, Value};
use crate::source::{Pos, SourceId};

const LOCATED_MARKER: &str = "__baton_located";

/// A value together with the position it was read from.
#[derive(Clone, Debug, PartialEq)]
pub struct Located<T> {
    pub value: T,
    pub pos: Pos,
}

impl<T> Located<T> {
    /// Wraps a value read from `pos`.
    pub fn new(value: T, pos: Pos) -> Self {
        Self { value, pos }
    }
}

impl<T> std::ops::Deref for Located<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: JsonSchema> JsonSchema for Located<T> {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_newtype_struct(LOCATED_MARKER, LocatedVisitor(std::marker::PhantomData))
    }
}

struct LocatedVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for LocatedVisitor<T> {
    type Value = Located<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Located<T>, D::Error> {
        Ok(Located { value: T::deserialize(d)?, pos: Pos::UNKNOWN })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Located<T>, A::Error> {
        let raw: [u32; 5] =
            seq.next_element()?.ok_or_else(|| de::Error::custom("missing position"))?;
        let value = seq.next_element()?.ok_or_else(|| de::Error::custom("missing value"))?;
        let pos =
            Pos { source: SourceId(raw[0]), line: raw[1], col: raw[2], byte: raw[3], len: raw[4] };
        Ok(Located { value, pos })
    }
}

/// Why a node could not be read as the type asked for, and where.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    pub code: &'static str,
    pub message: String,
    pub help: Option<String>,
    pub pos: Pos,
}

impl Error {
    fn at(mut self, pos: Pos) -> Self {
        if !self.pos.is_known() {
            self.pos = pos;
        }
        self
    }

    /// Turns the error into a diagnostic.
    pub fn into_diagnostic(self) -> crate::Diagnostic {
        let d = crate::Diagnostic::error(self.code, self.pos, self.message);
        match self.help {
            Some(help) => d.with_help(help),
            None => d,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error { code: "invalid-value", message: msg.to_string(), help: None, pos: Pos::UNKNOWN }
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Error {
            code: "wrong-type",
            message: format!(
                "expected {}, found {}",
                plain_type(&exp.to_string()),
                describe(&unexp)
            ),
            help: None,
            pos: Pos::UNKNOWN,
        }
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Error {
            code: "invalid-value",
            message: format!(
                "expected {}, found {}",
                plain_type(&exp.to_string()),
                describe(&unexp)
            ),
            help: None,
            pos: Pos::UNKNOWN,
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let help = match crate::suggest::closest(field, expected.iter().copied()) {
            Some(near) => {
                format!("did you mean `{near}`? known fields here: {}", expected.join(", "))
            }
            None => format!("known fields here: {}", expected.join(", ")),
        };
        Error {
            code: "unknown-field",
            message: format!("unknown field `{field}`"),
            help: Some(help),
            pos: Pos::UNKNOWN,
        }
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        let help = match crate::suggest::closest(variant, expected.iter().copied()) {
            Some(near) => format!("did you mean `{near}`? allowed: {}", expected.join(", ")),
            None => format!("allowed: {}", expected.join(", ")),
        };
        Error {
            code: "unknown-variant",
            message: format!("`{variant}` is not allowed here"),
            help: Some(help),
            pos: Pos::UNKNOWN,
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Error {
            code: "missing-field",
            message: format!("missing field `{field}`"),
            help: Some(format!("add `{field}:` to this mapping")),
            pos: Pos::UNKNOWN,
        }
    }

    fn duplicate_field(field: &'static str) -> Self {
        Error {
            code: "duplicate-key",
            message: format!("field `{field}` appears twice"),
            help: Some("remove one of them".to_owned()),
            pos: Pos::UNKNOWN,
        }
    }
}

/// Serde's names of Rust types, said the way a scenario author would.
fn plain_type(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number of zero or more".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "a list".to_owned(),
        "a boolean" => "true or false".to_owned(),
        other if other.starts_with("struct ") => "a mapping".to_owned(),
        other => other.to_owned(),
    }
}

fn describe(unexp: &de::Unexpected<'_>) -> String {
    match unexp {
        de::Unexpected::Str(s) => format!("the string {s:?}"),
        de::Unexpected::Unit => "null".to_owned(),
        de::Unexpected::Map => "a mapping".to_owned(),
        de::Unexpected::Seq => "a list".to_owned(),
        de::Unexpected::Signed(n) => format!("the number {n}"),
        de::Unexpected::Unsigned(n) => format!("the number {n}"),
        de::Unexpected::Float(n) => format!("the number {n}"),
        other => other.to_string(),
    }
}

/// Reads a `T` from a node.
pub fn from_node<'a, T: Deserialize<'a>>(node: &'a Node) -> Result<T, Error> {
    T::deserialize(NodeDe(node))
}

/// The deserializer over one node.
#[derive(Clone, Copy)]
struct NodeDe<'a>(&'a Node);

impl<'de> NodeDe<'de> {
    fn any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(i) => visitor.visit_i64(*i),
            Value::Float(f) => visitor.visit_f64(*f),
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Seq(items) => {
                let mut access = Seq { items: items.iter() };
                let value = visitor.visit_seq(&mut access)?;
                match access.items.len() {
                    0 => Ok(value),
                    n => Err(de::Error::invalid_length(items.len() - n + 1, &"fewer elements")),
                }
            }
            Value::Map(entries) => visitor.visit_map(Map { entries: entries.iter(), value: None }),
        }
    }
}

macro_rules! forward_located {
    ($($name:ident)*) => {
        $(
            fn $name<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                self.any(visitor).map_err(|e| e.at(self.0.pos))
            }
        )*
    };
}

impl<'de> Deserializer<'de> for NodeDe<'de> {
    type Error = Error;

    forward_located! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_unit deserialize_seq deserialize_map deserialize_identifier
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
        .map_err(|e| e.at(self.0.pos))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name == LOCATED_MARKER {
            let pos = self.0.pos;
            let raw = [pos.source.0, pos.line, pos.col, pos.byte, pos.len];
            visitor.visit_seq(LocatedSeq { pos: Some(raw), node: Some(self.0) })
        } else {
            visitor.visit_newtype_struct(self)
        }
        .map_err(|e| e.at(self.0.pos))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Map(entries) => visitor.visit_map(Map { entries: entries.iter(), value: None }),
            other => Err(Error {
                code: "wrong-type",
                message: format!("expected a mapping, found {}", other.type_name()),
                help: None,
                pos: Pos::UNKNOWN,
            }),
        }
        .map_err(|e| e.at(self.0.pos))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.0.value {
            Value::Str(s) => visitor.visit_enum(Enum { name: s, name_pos: self.0.pos, body: None }),
            Value::Map(entries) if entries.len() == 1 => {
                let (key, body) = &entries[0];
                visitor.visit_enum(Enum { name: &key.name, name_pos: key.pos, body: Some(body) })
            }
            other => Err(Error {
                code: "wrong-type",
                message: format!(
                    "expected one of {} (a string, or a mapping with one of them as its only key), found {}",
                    variants.join(", "),
                    other.type_name()
                ),
                help: None,
                pos: Pos::UNKNOWN,
            }),
        }
        .map_err(|e| e.at(self.0.pos))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

struct Seq<'a> {
    items: std::slice::Iter<'a, Node>,
}

impl<'de> SeqAccess<'de> for &mut Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.items.next() {
            Some(node) => seed.deserialize(NodeDe(node)).map(Some).map_err(|e| e.at(node.pos)),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Map<'a> {
    entries: std::slice::Iter<'a, (Key, Node)>,
    value: Option<&'a Node>,
}

impl<'de> MapAccess<'de> for Map<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(KeyDe(key)).map(Some).map_err(|e| e.at(key.pos))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let node = self.value.take().ok_or_else(|| de::Error::custom("value without a key"))?;
        seed.deserialize(NodeDe(node)).map_err(|e| e.at(node.pos))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// The deserializer over a mapping key: always a string.
struct KeyDe<'a>(&'a Key);

impl<'de> Deserializer<'de> for KeyDe<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_borrowed_str(&self.0.name)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if name == LOCATED_MARKER {
            let pos = self.0.pos;
            let raw = [pos.source.0, pos.line, pos.col, pos.byte, pos.len];
            visitor.visit_seq(KeySeq { pos: Some(raw), key: Some(self.0) })
        } else {
            visitor.visit_newtype_struct(self)
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let name: de::value::BorrowedStrDeserializer<'de, Error> =
            de::value::BorrowedStrDeserializer::new(&self.0.name);
        visitor.visit_enum(name)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

fn position_de(raw: [u32; 5]) -> de::value::SeqDeserializer<std::array::IntoIter<u32, 5>, Error> {
    de::value::SeqDeserializer::new(raw.into_iter())
}

/// Hands a [`Located`] its position, then its value.
struct LocatedSeq<'a> {
    pos: Option<[u32; 5]>,
    node: Option<&'a Node>,
}

impl<'de> SeqAccess<'de> for LocatedSeq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if let Some(raw) = self.pos.take() {
            return seed.deserialize(position_de(raw)).map(Some);
        }
        match self.node.take() {
            Some(node) => seed.deserialize(NodeDe(node)).map(Some),
            None => Ok(None),
        }
    }
}

struct KeySeq<'a> {
    pos: Option<[u32; 5]>,
    key: Option<&'a Key>,
}

impl<'de> SeqAccess<'de> for KeySeq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if let Some(raw) = self.pos.take() {
            return seed.deserialize(position_de(raw)).map(Some);
        }
        match self.key.take() {
            Some(key) => seed.deserialize(KeyDe(key)).map(Some),
            None => Ok(None),
        }
    }
}

struct Enum<'a> {
    name: &'a str,
    name_pos: Pos,
    body: Option<&'a Node>,
}

impl<'de> EnumAccess<'de> for Enum<'de> {
    type Error = Error;
    type Variant = Variant<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Variant<'de>), Error> {
        let name = seed
            .deserialize(self.name.into_deserializer())
            .map_err(|e: Error| e.at(self.name_pos))?;
        Ok((name, Variant { body: self.body, pos: self.name_pos }))
    }
}

struct Variant<'a> {
    body: Option<&'a Node>,
    pos: Pos,
}

impl<'de> VariantAccess<'de> for Variant<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.body {
            None | Some(Node { value: Value::Null, .. }) => Ok(()),
            Some(node) => Err(Error {
                code: "wrong-type",
                message: "this option takes no settings".to_owned(),
                help: Some("write it as a plain string".to_owned()),
                pos: node.pos,
            }),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        match self.body {
            Some(node) => seed.deserialize(NodeDe(node)).map_err(|e| e.at(node.pos)),
            None => Err(Error {
                code: "wrong-type",
                message: "this option needs a value".to_owned(),
                help: Some("write it as a mapping with the option as its only key".to_owned()),
                pos: self.pos,
            }),
        }
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        match self.body {
            Some(node) => NodeDe(node).deserialize_seq(visitor),
            None => Err(de::Error::custom("this option needs a list")),
        }
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.body {
            // A bare name selects the variant with all of its settings left out.
            None | Some(Node { value: Value::Null, .. }) => {
                visitor.visit_map(Map { entries: [].iter(), value: None })
            }
            Some(node) => NodeDe(node).deserialize_struct("", &[], visitor),
        }
        .map_err(|e| e.at(self.pos))
    }
}
