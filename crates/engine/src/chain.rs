//! The hash chain over a run's events: how a store notices that its log was damaged.
//!
//! Every stored event carries `sha256(previous event's hash ‖ the event's encoding)` (the
//! first event chains from [`GENESIS`]), and the run keeps the hash of its last event, its
//! *head*. Loading a run recomputes the chain: an event that was edited, deleted, swapped,
//! renumbered or cut off the tail breaks it at that event.
//!
//! An event's encoding is its envelope in fixed binary fields — seq, time in microseconds,
//! kind, schema version, level, attempt, each string with its length in front — followed
//! by its payload. How the payload is given is the run's chain [`Form`], recorded per run
//! so that a log keeps the form it was written with:
//! - [`Form::Encoded`] (every run created today): the payload's own encoding,
//!   [`EventData::encode`](crate::event::EventData::encode), made once when the event is
//!   appended and kept or re-derived byte for byte by every store — the very bytes a store
//!   writes (PostgreSQL's `data` column, the JSON a SQLite batch unpacks to), so hashing
//!   costs no second rendering;
//! - [`Form::CanonicalJson`] (runs created before it): the payload as canonical JSON (object
//!   keys sorted, no spaces) of its JSON value. A run of this form keeps it for every event
//!   appended later, so its chain stays one chain.
//!
//! The hash is SHA-256: the x86 SHA extensions and the ARMv8 crypto extensions compute it
//! in hardware (the `sha2` crate picks them at run time), it is the digest every auditor's
//! tool knows, and older logs verify with the same algorithm.
//!
//! This is damage detection, not tamper-proofing: the chain has no key, so whoever can write
//! the database can also recompute every hash after editing it. It catches a bad disk, a
//! careless hand edit, a restore of the wrong file or a bug in a store, not a forger.

use std::io::Write;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::event::{Event, VERSION};
use crate::store::Error;

/// A link of the chain: a sha256 digest.
pub type Hash = [u8; 32];

/// What the first event of every run chains from.
pub const GENESIS: Hash = [0; 32];

/// Names the canonical-JSON form, so that no other form can produce the same bytes.
const DOMAIN_V1: &[u8] = b"baton.event.v1\0";
/// Names the encoded form.
const DOMAIN_V2: &[u8] = b"baton.event.v2\0";

/// How a run's events are hashed; recorded with the run when it is created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Form {
    /// The payload as canonical JSON of its JSON value: runs created before the encoded
    /// form existed.
    CanonicalJson,
    /// The payload's encoding, as appended and stored: every run created today.
    #[default]
    Encoded,
}

impl Form {
    /// The number a store records the form as.
    pub fn number(self) -> i64 {
        match self {
            Form::CanonicalJson => 1,
            Form::Encoded => 2,
        }
    }

    /// The form a store recorded as `n`; `None` for a number this build does not know.
    pub fn from_number(n: i64) -> Option<Form> {
        match n {
            1 => Some(Form::CanonicalJson),
            2 => Some(Form::Encoded),
            _ => None,
        }
    }

    /// The error for a run whose recorded form this build does not know.
    pub fn unknown(run_id: &str, n: i64) -> Error {
        Error::Damaged {
            run_id: run_id.to_owned(),
            seq: 1,
            problem: format!(
                "the run records hash chain form {n}, which this build does not know (it reads 1 and 2): upgrade Baton to read it"
            ),
        }
    }
}

/// An event's payload as the chain takes it, in its run's [`Form`].
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// [`Form::CanonicalJson`]: the payload's JSON value.
    Json(&'a Value),
    /// [`Form::Encoded`]: the payload's encoding.
    Encoded(&'a [u8]),
}

/// Every stored field of an event, as the chain sees it.
#[derive(Clone, Copy, Debug)]
pub struct Fields<'a> {
    pub seq: u64,
    /// Microseconds since the Unix epoch (UTC): the precision every store keeps.
    pub at_us: i64,
    pub kind: &'a str,
    pub version: u16,
    pub level_id: Option<&'a str>,
    pub attempt: Option<u32>,
    pub payload: Payload<'a>,
}

impl<'a> Fields<'a> {
    /// The fields of an event about to be written with today's schema [`VERSION`], its
    /// payload given in its run's form.
    pub fn of(event: &'a Event, payload: Payload<'a>) -> Self {
        Fields {
            seq: event.seq,
            at_us: event.at.timestamp_micros(),
            kind: event.data.kind(),
            version: VERSION,
            level_id: event.level_id.as_deref(),
            attempt: event.attempt,
            payload,
        }
    }
}

/// The hash of an event whose predecessor's hash is `prev`.
pub fn link(prev: &Hash, fields: &Fields<'_>) -> Hash {
    let mut h = Hasher(Sha256::new());
    let domain = match fields.payload {
        Payload::Json(_) => DOMAIN_V1,
        Payload::Encoded(_) => DOMAIN_V2,
    };
    envelope(&mut h, domain, prev, fields);
    // The payload comes last, so it needs no length: nothing follows it.
    match fields.payload {
        Payload::Json(value) => canonical_json(value, &mut h),
        Payload::Encoded(bytes) => h.0.update(bytes),
    }
    h.0.finalize().into()
}

/// Everything an event's hash covers but its payload, in order.
fn envelope(h: &mut Hasher, domain: &[u8], prev: &Hash, fields: &Fields<'_>) {
    h.0.update(domain);
    h.0.update(prev);
    h.0.update(fields.seq.to_be_bytes());
    h.0.update(fields.at_us.to_be_bytes());
    h.bytes(fields.kind.as_bytes());
    h.0.update(fields.version.to_be_bytes());
    match fields.level_id {
        None => h.0.update([0]),
        Some(level) => {
            h.0.update([1]);
            h.bytes(level.as_bytes());
        }
    }
    match fields.attempt {
        None => h.0.update([0]),
        Some(attempt) => {
            h.0.update([1]);
            h.0.update(attempt.to_be_bytes());
        }
    }
}

/// The hashes of `events` in a run of `form`, chained from `prev` (the hash of the event
/// before the first).
pub fn hashes_in(form: Form, prev: Hash, events: &[Event]) -> Vec<Hash> {
    let mut prev = prev;
    let mut encoded = Vec::with_capacity(512);
    events
        .iter()
        .map(|e| {
            prev = match form {
                Form::Encoded => {
                    encoded.clear();
                    e.data.encode_into(&mut encoded);
                    link(&prev, &Fields::of(e, Payload::Encoded(&encoded)))
                }
                Form::CanonicalJson => {
                    let payload = e.data.payload();
                    link(&prev, &Fields::of(e, Payload::Json(&payload)))
                }
            };
            prev
        })
        .collect()
}

/// The hashes of `events` in a run created today ([`Form::Encoded`]), chained from `prev`.
pub fn hashes(prev: Hash, events: &[Event]) -> Vec<Hash> {
    hashes_in(Form::Encoded, prev, events)
}

/// Feeds a digest through `io::Write`, so the payload is encoded straight into it.
struct Hasher(Sha256);

impl Hasher {
    /// A byte string with its length in front, so that adjacent fields cannot run together.
    fn bytes(&mut self, b: &[u8]) {
        self.0.update((b.len() as u64).to_be_bytes());
        self.0.update(b);
    }
}

impl Write for Hasher {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `value` as canonical JSON: object keys in byte order, no whitespace, strings
/// escaped as `serde_json` escapes them, numbers as `serde_json` prints them. The same
/// value gives the same bytes whatever order its keys were read or inserted in.
pub fn canonical_json(value: &Value, out: &mut impl Write) {
    // Writing into a digest or a Vec cannot fail; the results are ignored for that reason.
    match value {
        Value::Null => {
            let _ = out.write_all(b"null");
        }
        Value::Bool(b) => {
            let _ = out.write_all(if *b { b"true" } else { b"false" });
        }
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => {
            let _ = serde_json::to_writer(&mut *out, s);
        }
        Value::Array(items) => {
            let _ = out.write_all(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                canonical_json(item, out);
            }
            let _ = out.write_all(b"]");
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            let _ = out.write_all(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                let _ = serde_json::to_writer(&mut *out, key);
                let _ = out.write_all(b":");
                canonical_json(&map[key], out);
            }
            let _ = out.write_all(b"}");
        }
    }
}

/// The sha256 of a JSON value's canonical form: equal values have equal digests, whatever
/// the order of their keys.
pub fn json_digest(value: &Value) -> Hash {
    let mut h = Hasher(Sha256::new());
    canonical_json(value, &mut h);
    h.0.finalize().into()
}

/// Lower-case hex of a hash.
pub fn hex(hash: &Hash) -> String {
    use std::fmt::Write as _;
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A hash read back from storage; `None` when it is not 32 bytes.
pub fn from_bytes(bytes: &[u8]) -> Option<Hash> {
    Hash::try_from(bytes).ok()
}

/// Walks a run's stored events in order and refuses at the first one that breaks the
/// sequence or the chain. Stores feed it what they read; it decides what is damage.
#[derive(Debug)]
pub struct Check<'a> {
    run_id: &'a str,
    /// The seq the next event must have.
    next_seq: u64,
    /// The hash the next event must chain from.
    prev: Hash,
}

impl<'a> Check<'a> {
    /// A check of the events after `after`, whose stored hash is `prev` ([`GENESIS`] when
    /// `after` is 0).
    pub fn new(run_id: &'a str, after: u64, prev: Hash) -> Self {
        Check { run_id, next_seq: after + 1, prev }
    }

    /// A damage report about event `seq`.
    pub fn damaged(&self, seq: u64, problem: impl Into<String>) -> Error {
        Error::Damaged { run_id: self.run_id.to_owned(), seq, problem: problem.into() }
    }

    /// The seq the next event must have.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Checks that the next stored event is numbered `seq` (before its other fields are
    /// read, so that a missing event is reported as missing).
    pub fn seq(&self, seq: u64) -> Result<(), Error> {
        let expected = self.next_seq;
        if seq > expected {
            return Err(self.damaged(
                expected,
                format!("the event is missing (the log goes from {} to {seq})", expected - 1),
            ));
        }
        if seq < expected {
            return Err(self.damaged(expected, format!("the event is numbered {seq}")));
        }
        Ok(())
    }

    /// Checks the next stored event: its number, then its hash against its fields and the
    /// event before it. `stored` is `None` when the event has no hash.
    pub fn event(&mut self, fields: &Fields<'_>, stored: Option<&Hash>) -> Result<(), Error> {
        self.seq(fields.seq)?;
        let expected = self.next_seq;
        let Some(stored) = stored else {
            return Err(self.damaged(expected, "the event has no hash"));
        };
        let computed = link(&self.prev, fields);
        if &computed != stored {
            return Err(self.damaged(
                expected,
                format!(
                    "its {} event does not match its hash: it, or its place in the log, was changed after it was written",
                    fields.kind
                ),
            ));
        }
        self.prev = computed;
        self.next_seq += 1;
        Ok(())
    }

    /// Links the next stored event into the chain without a hash of its own to check: a
    /// store that keeps one hash per commit batch passes every event of a batch through
    /// here, then checks the batch's hash with [`Check::settle`].
    pub fn pass(&mut self, fields: &Fields<'_>) -> Result<(), Error> {
        self.seq(fields.seq)?;
        self.prev = link(&self.prev, fields);
        self.next_seq += 1;
        Ok(())
    }

    /// Checks a batch's stored hash against the chain as linked so far: its events are the
    /// ones from `first` up to the last one passed. A mismatch is reported at `first`, the
    /// first event the batch's hash can no longer vouch for.
    pub fn settle(&self, first: u64, stored: &Hash) -> Result<(), Error> {
        if stored != &self.prev {
            let last = self.next_seq.saturating_sub(1);
            return Err(self.damaged(
                first,
                format!(
                    "events {first} to {last} do not match the hash of their batch: one of them, or their place in the log, was changed after it was written"
                ),
            ));
        }
        Ok(())
    }

    /// Checks the end of the log against the run's record: its `last_seq` and head hash
    /// (`None` when the run has none). Returns the number of the last event.
    pub fn finish(self, last_seq: u64, head: Option<&Hash>) -> Result<u64, Error> {
        let seen = self.next_seq - 1;
        if last_seq > seen {
            return Err(self.damaged(
                seen + 1,
                format!("the event is missing: the run records {last_seq} events, its log ends at {seen}"),
            ));
        }
        if last_seq < seen {
            return Err(self.damaged(
                last_seq + 1,
                format!("the run records only {last_seq} events, but its log goes on to {seen}"),
            ));
        }
        if head != Some(&self.prev) {
            return Err(self.damaged(
                seen + 1,
                format!(
                    "the run's head hash does not match event {seen}, the last one stored: events after it were lost or the run's record was changed"
                ),
            ));
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_ignores_key_order_and_spacing() {
        let a: Value =
            serde_json::from_str(r#"{"b": [1, 2.5, "x\n"], "a": {"d": null, "c": true}}"#)
                .expect("json");
        let b: Value =
            serde_json::from_str(r#"{"a":{"c":true,"d":null},"b":[1,2.5,"x\n"]}"#).expect("json");
        let mut out = Vec::new();
        canonical_json(&a, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), r#"{"a":{"c":true,"d":null},"b":[1,2.5,"x\n"]}"#);
        let mut other = Vec::new();
        canonical_json(&b, &mut other);
        assert_eq!(out, other);
    }

    fn fields<'a>(payload: &'a Value) -> Fields<'a> {
        Fields {
            seq: 3,
            at_us: 1_700_000_000_000_000,
            kind: "warning",
            version: 1,
            level_id: Some("l1"),
            attempt: Some(2),
            payload: Payload::Json(payload),
        }
    }

    #[test]
    fn every_field_changes_the_hash() {
        let payload = serde_json::json!({"message": "x"});
        let base = link(&GENESIS, &fields(&payload));
        let other_payload = serde_json::json!({"message": "y"});
        let variants = [
            Fields { seq: 4, ..fields(&payload) },
            Fields { at_us: 1, ..fields(&payload) },
            Fields { kind: "warnings", ..fields(&payload) },
            Fields { version: 2, ..fields(&payload) },
            Fields { level_id: None, ..fields(&payload) },
            Fields { level_id: Some("l2"), ..fields(&payload) },
            Fields { attempt: None, ..fields(&payload) },
            Fields { attempt: Some(3), ..fields(&payload) },
            fields(&other_payload),
        ];
        for v in &variants {
            assert_ne!(link(&GENESIS, v), base, "{v:?}");
        }
        assert_ne!(link(&[1; 32], &fields(&payload)), base, "the previous hash counts");
        // A level id and a kind cannot trade bytes: every string carries its length.
        let shifted = Fields { kind: "warningl", level_id: Some("1"), ..fields(&payload) };
        assert_ne!(link(&GENESIS, &shifted), base);
    }

    #[test]
    fn the_two_forms_never_meet_and_the_encoded_form_hashes_the_bytes_given() {
        let payload = serde_json::json!({"message": "x"});
        let text = br#"{"message":"x"}"#;
        let json = link(&GENESIS, &fields(&payload));
        let encoded =
            link(&GENESIS, &Fields { payload: Payload::Encoded(text), ..fields(&payload) });
        // The same payload, the same canonical text: the forms still differ by their domain.
        assert_ne!(json, encoded);
        let spaced = link(
            &GENESIS,
            &Fields { payload: Payload::Encoded(br#"{"message": "x"}"#), ..fields(&payload) },
        );
        assert_ne!(encoded, spaced, "the encoded form is the bytes themselves");
        for n in [1, 2] {
            assert_eq!(Form::from_number(n).map(Form::number), Some(n));
        }
        assert_eq!(Form::from_number(3), None);
    }

    #[test]
    fn a_check_names_the_first_bad_event() {
        let payload = serde_json::json!({"message": "x"});
        let one = Fields { seq: 1, ..fields(&payload) };
        let h1 = link(&GENESIS, &one);
        let two = Fields { seq: 2, ..fields(&payload) };
        let h2 = link(&h1, &two);
        let mut ok = Check::new("r", 0, GENESIS);
        ok.event(&one, Some(&h1)).expect("event 1");
        ok.event(&two, Some(&h2)).expect("event 2");
        assert_eq!(ok.finish(2, Some(&h2)).expect("intact"), 2);

        let mut gap = Check::new("r", 0, GENESIS);
        gap.event(&one, Some(&h1)).expect("event 1");
        let err =
            gap.event(&Fields { seq: 3, ..fields(&payload) }, Some(&h2)).expect_err("damaged");
        assert!(matches!(&err, Error::Damaged { seq: 2, .. }), "{err}");
        assert!(err.to_string().contains("run r"), "{err}");

        let mut swapped = Check::new("r", 0, GENESIS);
        let err = swapped.event(&one, Some(&h2)).expect_err("damaged");
        assert!(matches!(err, Error::Damaged { seq: 1, .. }));

        let mut cut = Check::new("r", 0, GENESIS);
        cut.event(&one, Some(&h1)).expect("event 1");
        assert!(matches!(cut.finish(1, Some(&h2)), Err(Error::Damaged { seq: 2, .. })));

        let mut partial = Check::new("r", 1, h1);
        partial.event(&two, Some(&h2)).expect("event 2 chains from event 1's stored hash");
        assert!(matches!(partial.finish(3, Some(&h2)), Err(Error::Damaged { seq: 3, .. })));
    }
}
