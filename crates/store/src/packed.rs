//! The packed event format: how the SQLite store writes one commit batch of a run's events
//! as one compact blob, and reads it back.
//!
//! A batch body is a format byte, the number of events, then per event: its time as a
//! signed microsecond step from the event before (the first from the batch row's `at_us`),
//! its kind as a code of the database's `kinds` table, its schema version, its level (none,
//! the previous event's, or a new name), its attempt, and its payload as a packed value.
//!
//! A payload comes in as JSON text — the event's encoding, which the hash chain hashes —
//! and is packed straight from the text, with no JSON value built on the way; unpacking
//! writes the very same text back (strings escaped as `serde_json` escapes them, numbers
//! as it prints them, keys in their order), which a run of the encoded chain form hashes
//! as it comes out.
//!
//! A packed value is one tag byte and what the tag needs: null, false, true, a small
//! integer in the tag itself, a varint integer, an f64, a number kept as its text (one
//! that the other forms would print differently), a string, an array, an object with its
//! keys inline, or an object whose key list is a *shape* of the database's `shapes` table
//! followed by its values alone. Two kinds of string are special:
//! - every string of [`SHARED_MIN`] bytes or more written inline takes the next *ordinal*
//!   of its batch; a later copy of it, in the same batch or any later batch of the run, is
//!   written as a reference (the first seq of the batch holding it, its ordinal) — so a
//!   model's answer repeated as a level's output and a run's final output is stored once;
//! - a string of exactly 64 lowercase hex digits (a sha256) is stored as its 32 bytes.
//!
//! Nothing here is lossy: a batch unpacks to the very payload text the engine wrote, which
//! is what the hash chain ([`baton_engine::chain`]) is checked against. Anything that cannot be
//! unpacked (a cut blob, an unknown tag, a reference to nothing) is reported as damage of
//! the batch by the caller.

use std::borrow::Cow;
use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// The body format this build writes and reads.
pub const FORMAT: u8 = 1;

/// Strings this long or longer may be referenced by later copies.
pub const SHARED_MIN: usize = 32;

/// Objects with more keys than this are written with their keys inline.
const SHAPE_KEYS_MAX: usize = 32;
/// Keys longer than this keep an object's keys inline.
const SHAPE_KEY_LEN_MAX: usize = 64;

const T_NULL: u8 = 0;
const T_FALSE: u8 = 1;
const T_TRUE: u8 = 2;
const T_UINT: u8 = 3;
const T_NEGINT: u8 = 4;
const T_F64: u8 = 5;
const T_STR: u8 = 6;
const T_REF: u8 = 7;
const T_HEX32: u8 = 8;
const T_ARRAY: u8 = 9;
const T_OBJECT: u8 = 10;
const T_SHAPED: u8 = 11;
const T_NUMTEXT: u8 = 12;
/// Tags from here up are the integers `tag - T_SMALL`.
const T_SMALL: u8 = 32;

const LEVEL_NONE: u8 = 0;
const LEVEL_SAME: u8 = 1;
const LEVEL_NEW: u8 = 2;

/// Where a shared string is stored: the first seq of its batch and its ordinal there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub batch: u64,
    pub ordinal: u32,
}

/// What a writer knows of the shared strings a run already stored, by a 128-bit digest of
/// each: the places later copies can refer to.
#[derive(Debug, Default)]
pub struct RunStrings {
    places: HashMap<u128, Place>,
}

impl RunStrings {
    /// How many strings are known.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }
}

fn digest(s: &str) -> u128 {
    let d = Sha256::digest(s.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&d[..16]);
    u128::from_le_bytes(first)
}

/// The codes a writer needs from the database's dictionaries.
pub trait Intern {
    /// The code of an event kind (assigned on first use).
    fn kind(&mut self, name: &str) -> Result<u64, String>;
    /// The id of an object's key list, or `None` to write the keys inline.
    fn shape(&mut self, keys: &[&str]) -> Result<Option<u64>, String>;
}

/// What a reader needs from the database to unpack: its dictionaries, and the shared
/// strings of batches other than the one being read.
pub trait Resolve {
    fn kind(&mut self, code: u64) -> Result<String, String>;
    fn shape(&mut self, id: u64) -> Result<std::sync::Arc<[String]>, String>;
    /// The shared string `ordinal` of the run's batch starting at `batch` (not this one).
    fn shared(&mut self, batch: u64, ordinal: u32) -> Result<String, String>;
}

/// One event as packed: every field of the envelope and the payload, as JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct Unpacked {
    pub at_us: i64,
    pub kind: String,
    pub version: u16,
    pub level_id: Option<String>,
    pub attempt: Option<u32>,
    pub payload: Vec<u8>,
}

/// One event to pack, borrowed; its payload JSON text.
#[derive(Clone, Copy, Debug)]
pub struct EventRef<'a> {
    pub at_us: i64,
    pub kind: &'a str,
    pub version: u16,
    pub level_id: Option<&'a str>,
    pub attempt: Option<u32>,
    pub payload: &'a [u8],
}

impl Unpacked {
    /// The event, borrowed for [`pack`].
    pub fn as_ref(&self) -> EventRef<'_> {
        EventRef {
            at_us: self.at_us,
            kind: &self.kind,
            version: self.version,
            level_id: self.level_id.as_deref(),
            attempt: self.attempt,
            payload: &self.payload,
        }
    }
}

/// Packs the events of one batch, whose first event is `first_seq` and whose row keeps
/// `at_us` (the first event's time). With `known`, strings the run already stored are
/// referenced and the batch's own shared strings are added to it.
pub fn pack(
    first_seq: u64,
    at_us: i64,
    events: &[EventRef<'_>],
    intern: &mut dyn Intern,
    known: Option<&mut RunStrings>,
) -> Result<Vec<u8>, String> {
    // Without the run's strings, copies within the batch are still stored once.
    let mut local = RunStrings::default();
    let known = match known {
        Some(known) => known,
        None => &mut local,
    };
    let mut w = Writer { out: Vec::with_capacity(256), first_seq, ordinals: 0, known, intern };
    w.out.push(FORMAT);
    put_varint(&mut w.out, events.len() as u64);
    let mut prev_at = at_us;
    let mut prev_level: Option<&str> = None;
    for e in events {
        put_varint(&mut w.out, zigzag(e.at_us.wrapping_sub(prev_at)));
        prev_at = e.at_us;
        let code = w.intern.kind(e.kind)?;
        put_varint(&mut w.out, code);
        put_varint(&mut w.out, u64::from(e.version));
        match (e.level_id, prev_level) {
            (None, _) => w.out.push(LEVEL_NONE),
            (Some(l), Some(p)) if l == p => w.out.push(LEVEL_SAME),
            (Some(l), _) => {
                w.out.push(LEVEL_NEW);
                put_bytes(&mut w.out, l.as_bytes());
            }
        }
        prev_level = e.level_id;
        put_varint(&mut w.out, e.attempt.map_or(0, |a| u64::from(a) + 1));
        let end = skip_ws(e.payload, w.json(e.payload, 0, 0)?);
        if end != e.payload.len() {
            return Err(format!("a `{}` payload goes on after its value", e.kind));
        }
    }
    Ok(w.out)
}

struct Writer<'a> {
    out: Vec<u8>,
    first_seq: u64,
    ordinals: u32,
    known: &'a mut RunStrings,
    intern: &'a mut dyn Intern,
}

impl Writer<'_> {
    /// Packs the JSON value that starts at `at` in `text` (after any whitespace); where it
    /// ends.
    fn json(&mut self, text: &[u8], at: usize, depth: usize) -> Result<usize, String> {
        if depth > DEPTH_MAX {
            return Err("a payload nests values too deep".to_owned());
        }
        let at = skip_ws(text, at);
        match text.get(at) {
            None => Err("a payload ends where a value should be".to_owned()),
            Some(b'n') => self.literal(text, at, b"null", T_NULL),
            Some(b't') => self.literal(text, at, b"true", T_TRUE),
            Some(b'f') => self.literal(text, at, b"false", T_FALSE),
            Some(b'"') => {
                let end = string_end(text, at)?;
                self.string(&unquote(&text[at..end])?);
                Ok(end)
            }
            Some(b'[') => {
                let mut starts = Vec::new();
                let close = items(text, at, b']', |i| {
                    starts.push(i);
                    value_end(text, i)
                })?;
                self.out.push(T_ARRAY);
                put_varint(&mut self.out, starts.len() as u64);
                for i in starts {
                    self.json(text, i, depth + 1)?;
                }
                Ok(close)
            }
            Some(b'{') => {
                let mut members: Vec<(Cow<'_, str>, usize)> = Vec::new();
                let close = items(text, at, b'}', |i| {
                    if text.get(i) != Some(&b'"') {
                        return Err("a payload's object has a key that is not a string".to_owned());
                    }
                    let key_end = string_end(text, i)?;
                    let key = unquote(&text[i..key_end])?;
                    let colon = skip_ws(text, key_end);
                    if text.get(colon) != Some(&b':') {
                        return Err("a payload's object has a key without a value".to_owned());
                    }
                    let value = skip_ws(text, colon + 1);
                    members.push((key, value));
                    value_end(text, value)
                })?;
                let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_ref()).collect();
                let shapeable = !keys.is_empty()
                    && keys.len() <= SHAPE_KEYS_MAX
                    && keys.iter().all(|k| k.len() <= SHAPE_KEY_LEN_MAX);
                let shape = if shapeable { self.intern.shape(&keys)? } else { None };
                match shape {
                    Some(id) => {
                        self.out.push(T_SHAPED);
                        put_varint(&mut self.out, id);
                        for (_, i) in &members {
                            self.json(text, *i, depth + 1)?;
                        }
                    }
                    None => {
                        self.out.push(T_OBJECT);
                        put_varint(&mut self.out, members.len() as u64);
                        for (k, i) in &members {
                            put_bytes(&mut self.out, k.as_bytes());
                            self.json(text, *i, depth + 1)?;
                        }
                    }
                }
                Ok(close)
            }
            Some(_) => {
                let end = token_end(text, at);
                self.number(&text[at..end])?;
                Ok(end)
            }
        }
    }

    fn literal(&mut self, text: &[u8], at: usize, word: &[u8], tag: u8) -> Result<usize, String> {
        if text[at..].starts_with(word) && token_end(text, at) == at + word.len() {
            self.out.push(tag);
            Ok(at + word.len())
        } else {
            Err(format!("a payload holds `{}`, not a JSON value", token(text, at)))
        }
    }

    /// A number as compact as the text allows: an integer as the integer, a fraction as an
    /// f64 when printing the f64 gives the same text back, else the text itself.
    fn number(&mut self, tok: &[u8]) -> Result<(), String> {
        let bad =
            || format!("a payload holds `{}`, not a JSON value", String::from_utf8_lossy(tok));
        let text = std::str::from_utf8(tok).map_err(|_| bad())?;
        // Digits alone, no `+`, no leading zero, no `-0`: the integer prints as this text.
        let digits = text.strip_prefix('-').unwrap_or(text);
        let plain = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && text != "-0";
        if plain {
            if let Ok(u) = text.parse::<u64>() {
                match u8::try_from(u) {
                    Ok(small) if small <= u8::MAX - T_SMALL => self.out.push(T_SMALL + small),
                    _ => {
                        self.out.push(T_UINT);
                        put_varint(&mut self.out, u);
                    }
                }
                return Ok(());
            }
            if let Ok(i) = text.parse::<i64>() {
                // Negative (a non-negative one is a u64 above): -1 is 0, -2 is 1, ...
                self.out.push(T_NEGINT);
                put_varint(&mut self.out, !(i as u64));
                return Ok(());
            }
        }
        // Whatever else it is, it must be a JSON number.
        serde_json::from_slice::<serde_json::Number>(tok).map_err(|_| bad())?;
        if let Ok(f) = text.parse::<f64>()
            && f.is_finite()
            && serde_json::to_vec(&f).is_ok_and(|printed| printed == tok)
        {
            self.out.push(T_F64);
            self.out.extend_from_slice(&f.to_le_bytes());
            return Ok(());
        }
        self.out.push(T_NUMTEXT);
        put_bytes(&mut self.out, tok);
        Ok(())
    }

    fn string(&mut self, s: &str) {
        if s.len() < SHARED_MIN {
            self.out.push(T_STR);
            put_bytes(&mut self.out, s.as_bytes());
            return;
        }
        let key = digest(s);
        if let Some(place) = self.known.places.get(&key) {
            self.out.push(T_REF);
            put_varint(&mut self.out, place.batch);
            put_varint(&mut self.out, u64::from(place.ordinal));
            return;
        }
        self.known.places.insert(key, Place { batch: self.first_seq, ordinal: self.ordinals });
        self.ordinals += 1;
        match hex32(s) {
            Some(bytes) => {
                self.out.push(T_HEX32);
                self.out.extend_from_slice(&bytes);
            }
            None => {
                self.out.push(T_STR);
                put_bytes(&mut self.out, s.as_bytes());
            }
        }
    }
}

/// The 32 bytes of a string of exactly 64 lowercase hex digits.
fn hex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// The first byte at or after `at` that is not JSON whitespace.
fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Where the token (a number or a word) starting at `at` ends.
fn token_end(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        at += 1;
    }
    at
}

/// The token at `at`, for a message.
fn token(text: &[u8], at: usize) -> String {
    let end = token_end(text, at).max(at + 1).min(text.len());
    String::from_utf8_lossy(&text[at..end]).into_owned()
}

/// Where the JSON string whose opening quote is at `at` ends (after its closing quote).
fn string_end(text: &[u8], at: usize) -> Result<usize, String> {
    let mut i = at + 1;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => return Ok(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    Err("a payload's string is cut short".to_owned())
}

/// The text of a quoted JSON string: borrowed when it has no escapes, decoded when it has.
fn unquote(quoted: &[u8]) -> Result<Cow<'_, str>, String> {
    let inner = &quoted[1..quoted.len() - 1];
    if !inner.iter().any(|&b| b == b'\\' || b < 0x20) {
        return std::str::from_utf8(inner)
            .map(Cow::Borrowed)
            .map_err(|_| "a payload's string is not UTF-8".to_owned());
    }
    serde_json::from_slice::<String>(quoted)
        .map(Cow::Owned)
        .map_err(|e| format!("a payload's string cannot be read: {e}"))
}

/// Where the JSON value at `at` ends, skipped without being read: the writer's first look
/// at an array's items or an object's members, which it packs once it knows them all.
fn value_end(text: &[u8], at: usize) -> Result<usize, String> {
    match text.get(at) {
        Some(b'"') => string_end(text, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = at;
            while let Some(&b) = text.get(i) {
                match b {
                    b'"' => {
                        i = string_end(text, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            Err("a payload's array or object is cut short".to_owned())
        }
        Some(_) => Ok(token_end(text, at)),
        None => Err("a payload ends where a value should be".to_owned()),
    }
}

/// Walks the items of the array or object opening at `at` and closing with `close`,
/// handing `item` where each starts (it says where the item ends); where the whole ends.
fn items(
    text: &[u8],
    at: usize,
    close: u8,
    mut item: impl FnMut(usize) -> Result<usize, String>,
) -> Result<usize, String> {
    let mut i = skip_ws(text, at + 1);
    if text.get(i) == Some(&close) {
        return Ok(i + 1);
    }
    loop {
        i = skip_ws(text, item(i)?);
        match text.get(i) {
            Some(b',') => i = skip_ws(text, i + 1),
            Some(&b) if b == close => return Ok(i + 1),
            _ => return Err("a payload's array or object is not closed where it ends".to_owned()),
        }
    }
}

/// Writes `s` as a JSON string, escaped as `serde_json` escapes it.
fn put_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The events of a batch body and the shared strings it holds inline, in ordinal order.
#[derive(Debug)]
pub struct Batch {
    pub events: Vec<Unpacked>,
    pub shared: Vec<String>,
}

/// Unpacks the body of the batch starting at `first_seq`, whose row keeps `at_us`.
pub fn unpack(
    first_seq: u64,
    at_us: i64,
    body: &[u8],
    resolve: &mut dyn Resolve,
) -> Result<Batch, String> {
    read_body(first_seq, at_us, body, resolve, true)
}

/// The shared strings a batch body holds inline, in ordinal order, without resolving its
/// references to other batches (what a reference to this batch needs).
pub fn shared_strings(
    first_seq: u64,
    at_us: i64,
    body: &[u8],
    resolve: &mut dyn Resolve,
) -> Result<Vec<String>, String> {
    read_body(first_seq, at_us, body, resolve, false).map(|b| b.shared)
}

fn read_body(
    first_seq: u64,
    at_us: i64,
    body: &[u8],
    resolve: &mut dyn Resolve,
    resolve_refs: bool,
) -> Result<Batch, String> {
    let mut r = Reader { body, at: 0, first_seq, shared: Vec::new(), resolve, resolve_refs };
    let format = r.byte()?;
    if format != FORMAT {
        return Err(format!("its body is in format {format}, this build reads format {FORMAT}"));
    }
    let count = r.varint()?;
    if count == 0 || count > body.len() as u64 {
        return Err(format!("its body says it holds {count} events"));
    }
    let mut events = Vec::with_capacity(count as usize);
    let mut at = at_us;
    let mut level: Option<String> = None;
    for _ in 0..count {
        at = at.wrapping_add(unzigzag(r.varint()?));
        let code = r.varint()?;
        let kind = r.resolve.kind(code)?;
        let version = u16::try_from(r.varint()?).map_err(|_| "a schema version out of range")?;
        level = match r.byte()? {
            LEVEL_NONE => None,
            LEVEL_SAME if level.is_some() => level,
            LEVEL_NEW => Some(r.text()?),
            other => return Err(format!("an event's level is marked {other}")),
        };
        let attempt = match r.varint()? {
            0 => None,
            a => Some(u32::try_from(a - 1).map_err(|_| "an attempt out of range")?),
        };
        let mut payload = Vec::with_capacity(256);
        r.json(0, &mut payload)?;
        events.push(Unpacked {
            at_us: at,
            kind,
            version,
            level_id: level.clone(),
            attempt,
            payload,
        });
    }
    if r.at != body.len() {
        return Err(format!(
            "its body goes on for {} bytes after its last event",
            body.len() - r.at
        ));
    }
    Ok(Batch { events, shared: r.shared })
}

/// How deep values nest before a body is taken for damaged (the engine writes far less).
const DEPTH_MAX: usize = 128;

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
    first_seq: u64,
    shared: Vec<String>,
    resolve: &'a mut dyn Resolve,
    /// Whether references to other batches are followed (else they read as null).
    resolve_refs: bool,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.body.get(self.at).ok_or("its body is cut short")?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.body.len());
        let end = end.ok_or("its body is cut short")?;
        let body: &'a [u8] = self.body;
        let b = &body[self.at..end];
        self.at = end;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("its body holds a number too long to read".to_owned())
    }

    fn len(&mut self) -> Result<usize, String> {
        let n = self.varint()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.body.len() - self.at)
            .ok_or_else(|| "its body is cut short".to_owned())
    }

    fn text(&mut self) -> Result<String, String> {
        self.str().map(str::to_owned)
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let n = self.len()?;
        let b = self.take(n)?;
        std::str::from_utf8(b).map_err(|_| "its body holds a string that is not UTF-8".into())
    }

    /// Writes the next packed value to `out` as the JSON text it was packed from.
    fn json(&mut self, depth: usize, out: &mut Vec<u8>) -> Result<(), String> {
        if depth > DEPTH_MAX {
            return Err("its body nests values too deep".to_owned());
        }
        let tag = self.byte()?;
        // Writing into a Vec cannot fail: the numbers' results are ignored for that reason.
        match tag {
            T_NULL => out.extend_from_slice(b"null"),
            T_FALSE => out.extend_from_slice(b"false"),
            T_TRUE => out.extend_from_slice(b"true"),
            T_UINT => {
                let _ = serde_json::to_writer(&mut *out, &self.varint()?);
            }
            T_NEGINT => {
                let v = self.varint()?;
                let v = i64::try_from(v).map_err(|_| "a negative number out of range")?;
                let _ = serde_json::to_writer(&mut *out, &!v);
            }
            T_F64 => {
                let b: [u8; 8] = self.take(8)?.try_into().map_err(|_| "its body is cut short")?;
                let f = f64::from_le_bytes(b);
                if !f.is_finite() {
                    return Err("a number that is not finite".to_owned());
                }
                let _ = serde_json::to_writer(&mut *out, &f);
            }
            T_NUMTEXT => {
                let n = self.len()?;
                let text = self.take(n)?;
                if text.is_empty() || token_end(text, 0) != text.len() {
                    return Err("its body holds a number that is not one".to_owned());
                }
                out.extend_from_slice(text);
            }
            T_STR => {
                let s = self.str()?;
                if s.len() >= SHARED_MIN {
                    self.shared.push(s.to_owned());
                }
                put_json_str(out, s);
            }
            T_HEX32 => {
                let b = self.take(32)?;
                let mut s = String::with_capacity(64);
                for byte in b {
                    s.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
                    s.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
                }
                put_json_str(out, &s);
                self.shared.push(s);
            }
            T_REF => {
                let batch = self.varint()?;
                let ordinal =
                    u32::try_from(self.varint()?).map_err(|_| "a reference out of range")?;
                if batch == self.first_seq {
                    let s = self.shared.get(ordinal as usize).ok_or_else(|| {
                        format!("a reference to string {ordinal} of its own batch, which it does not hold")
                    })?;
                    put_json_str(out, s);
                } else if batch > self.first_seq {
                    return Err(format!("a reference to the later batch at {batch}"));
                } else if !self.resolve_refs {
                    out.extend_from_slice(b"null");
                } else {
                    put_json_str(out, &self.resolve.shared(batch, ordinal)?);
                }
            }
            T_ARRAY => {
                let n = self.len()?;
                out.push(b'[');
                for i in 0..n {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.json(depth + 1, out)?;
                }
                out.push(b']');
            }
            T_OBJECT => {
                let n = self.len()?;
                out.push(b'{');
                for i in 0..n {
                    if i > 0 {
                        out.push(b',');
                    }
                    put_json_str(out, self.str()?);
                    out.push(b':');
                    self.json(depth + 1, out)?;
                }
                out.push(b'}');
            }
            T_SHAPED => {
                let id = self.varint()?;
                let keys = self.resolve.shape(id)?;
                out.push(b'{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    put_json_str(out, k);
                    out.push(b':');
                    self.json(depth + 1, out)?;
                }
                out.push(b'}');
            }
            small if small >= T_SMALL => {
                let _ = serde_json::to_writer(&mut *out, &(small - T_SMALL));
            }
            other => return Err(format!("its body holds an unknown tag {other}")),
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[derive(Default)]
    struct Dict {
        kinds: Vec<String>,
        shapes: Vec<Arc<[String]>>,
        batches: HashMap<u64, Vec<String>>,
    }

    impl Intern for Dict {
        fn kind(&mut self, name: &str) -> Result<u64, String> {
            let at = self.kinds.iter().position(|k| k == name).unwrap_or_else(|| {
                self.kinds.push(name.to_owned());
                self.kinds.len() - 1
            });
            Ok(at as u64 + 1)
        }
        fn shape(&mut self, keys: &[&str]) -> Result<Option<u64>, String> {
            let at =
                self.shapes.iter().position(|s| s.iter().eq(keys.iter())).unwrap_or_else(|| {
                    self.shapes.push(keys.iter().map(|k| (*k).to_owned()).collect());
                    self.shapes.len() - 1
                });
            Ok(Some(at as u64 + 1))
        }
    }

    impl Resolve for Dict {
        fn kind(&mut self, code: u64) -> Result<String, String> {
            self.kinds
                .get((code as usize).wrapping_sub(1))
                .cloned()
                .ok_or_else(|| "no such kind".into())
        }
        fn shape(&mut self, id: u64) -> Result<Arc<[String]>, String> {
            self.shapes
                .get((id as usize).wrapping_sub(1))
                .cloned()
                .ok_or_else(|| "no such shape".into())
        }
        fn shared(&mut self, batch: u64, ordinal: u32) -> Result<String, String> {
            self.batches
                .get(&batch)
                .and_then(|s| s.get(ordinal as usize))
                .cloned()
                .ok_or_else(|| "no such string".into())
        }
    }

    /// An event whose payload is `payload` as `serde_json` writes it.
    #[allow(clippy::needless_pass_by_value)]
    fn event(at_us: i64, kind: &str, level: Option<&str>, payload: serde_json::Value) -> Unpacked {
        Unpacked {
            at_us,
            kind: kind.to_owned(),
            version: 2,
            level_id: level.map(str::to_owned),
            attempt: level.map(|_| 1),
            payload: serde_json::to_vec(&payload).unwrap(),
        }
    }

    fn pack_one(text: &[u8], dict: &mut Dict) -> Result<Vec<u8>, String> {
        let e = EventRef {
            at_us: 0,
            kind: "warning",
            version: 2,
            level_id: None,
            attempt: None,
            payload: text,
        };
        pack(1, 0, &[e], dict, None)
    }

    #[test]
    fn any_json_text_comes_back_byte_for_byte_and_anything_else_is_refused() {
        let mut dict = Dict::default();
        let texts: &[&str] = &[
            r#"{"b":1,"a":[1E5,1.50,-0,0.1e1,-0.0,1e-7,12345678901234567890123,0]}"#,
            r#"{"s":"tab\t\u2028 \ud83d\ude00 é","empty":{},"list":[],"nested":[[[]]]}"#,
            r#"{"dup":1,"dup":2}"#,
            r#""just a string""#,
            "[true,false,null]",
        ];
        for text in texts {
            let body = pack_one(text.as_bytes(), &mut dict).unwrap();
            let batch = unpack(1, 0, &body, &mut dict).unwrap();
            // Text the engine writes comes back as it went in; these are not all such
            // text, so only the value is the same.
            let back: serde_json::Value = serde_json::from_slice(&batch.events[0].payload).unwrap();
            assert_eq!(back, serde_json::from_str::<serde_json::Value>(text).unwrap(), "{text}");
        }
        // Numbers that print another way are kept as their text.
        let odd = br#"[1E5,1.50,-0,0.1e1,12345678901234567890123]"#;
        let body = pack_one(odd, &mut dict).unwrap();
        assert_eq!(unpack(1, 0, &body, &mut dict).unwrap().events[0].payload, odd.to_vec());
        // Spaces between tokens are not kept: the engine's encoding has none.
        let spaced = pack_one(br#"{ "a" : [ 1 , 2 ] }"#, &mut dict).unwrap();
        assert_eq!(
            unpack(1, 0, &spaced, &mut dict).unwrap().events[0].payload,
            br#"{"a":[1,2]}"#.to_vec()
        );
        for bad in [
            "",
            "{",
            r#"{"a"}"#,
            r#"{"a":1,}"#,
            "[1 2]",
            "nul",
            "tru",
            "01",
            "1.",
            "+1",
            r#""cut"#,
            r#"{1:2}"#,
            "[1]]",
            "NaN",
            "\"x\u{1}\"",
        ] {
            assert!(pack_one(bad.as_bytes(), &mut dict).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn every_value_round_trips_and_repeated_text_is_stored_once() {
        let text = "All good. ".repeat(24);
        let sha = "6219925699ffc83b946eff61b8437056e52dc8443119a8285151550850815094";
        let first = vec![
            event(
                1_700_000_000_000_000,
                "level_started",
                Some("l1"),
                serde_json::json!({"role": "l1", "parent": null}),
            ),
            event(
                1_700_000_000_000_090,
                "model_response",
                Some("l1"),
                serde_json::json!({
                    "request_hash": sha, "text": text, "usage": {"input_tokens": 10, "output_tokens": 50},
                    "cost_usd": 0.001, "tool_calls": [], "big": u64::MAX, "neg": -5, "min": i64::MIN,
                    "odd": {"": 1, "k": [true, false, null, 1.5e300, -0.0]}, "shared": "short",
                    "HEX": sha.to_uppercase(),
                }),
            ),
            event(
                1_699_999_999_999_000,
                "level_finished",
                Some("l1"),
                serde_json::json!({"output": text}),
            ),
            event(
                1_700_000_000_000_100,
                "gate_decision",
                None,
                serde_json::json!({"source": "l1"}),
            ),
        ];
        let mut dict = Dict::default();
        let mut known = RunStrings::default();
        let refs: Vec<_> = first.iter().map(Unpacked::as_ref).collect();
        let body = pack(1, first[0].at_us, &refs, &mut dict, Some(&mut known)).unwrap();
        assert!(body.len() < text.len() + 240, "one copy of the text: {} bytes", body.len());
        // Every payload comes back byte for byte.
        let batch = unpack(1, first[0].at_us, &body, &mut dict).unwrap();
        assert_eq!(batch.events, first);
        dict.batches.insert(1, batch.shared);
        // A later batch refers to the text the first one holds.
        let later = vec![event(
            1_700_000_000_001_000,
            "scenario_finished",
            None,
            serde_json::json!({"final_output": text, "checksum": sha}),
        )];
        let refs: Vec<_> = later.iter().map(Unpacked::as_ref).collect();
        let body = pack(5, later[0].at_us, &refs, &mut dict, Some(&mut known)).unwrap();
        assert!(body.len() < 20, "references only: {} bytes", body.len());
        assert_eq!(unpack(5, later[0].at_us, &body, &mut dict).unwrap().events, later);
        // Without the run's strings, the text is written again.
        let alone = pack(5, later[0].at_us, &refs, &mut dict, None).unwrap();
        assert!(alone.len() > text.len());
        assert_eq!(unpack(5, later[0].at_us, &alone, &mut dict_like(&dict)).unwrap().events, later);
    }

    fn dict_like(d: &Dict) -> Dict {
        Dict { kinds: d.kinds.clone(), shapes: d.shapes.clone(), batches: HashMap::new() }
    }

    #[test]
    fn a_cut_or_altered_body_is_refused_never_misread_as_panics() {
        let events = vec![event(
            5,
            "warning",
            Some("a"),
            serde_json::json!({"message": "x".repeat(40), "n": [1, 2, 3]}),
        )];
        let mut dict = Dict::default();
        let refs: Vec<_> = events.iter().map(Unpacked::as_ref).collect();
        let body = pack(1, 5, &refs, &mut dict, Some(&mut RunStrings::default())).unwrap();
        for cut in 0..body.len() {
            assert!(unpack(1, 5, &body[..cut], &mut dict).is_err(), "cut at {cut}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(unpack(1, 5, &longer, &mut dict).unwrap_err().contains("goes on"));
        for i in 0..body.len() {
            for bit in 0..8 {
                let mut flipped = body.clone();
                flipped[i] ^= 1 << bit;
                if let Ok(b) = unpack(1, 5, &flipped, &mut dict) {
                    assert_ne!(b.events, events, "byte {i} bit {bit} changed nothing");
                }
            }
        }
    }
}
