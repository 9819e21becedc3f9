//! What both stores do with columns once read: check an event against the run's hash chain
//! and decode it, naming the run and the event when it cannot be; make a run's idempotency
//! claim of its three columns.

use baton_engine::chain::{self, Check, Fields, Form, Payload};
use baton_engine::event::{Event, EventData};
use baton_engine::store::Error;
use chrono::DateTime;

/// A run's idempotency claim from its `idempotency_key`, `key_request` and `key_expires_us`
/// columns: none without a key; a key needs its expiry.
pub(crate) fn key_claim(
    key: Option<String>,
    request: Option<String>,
    expires_us: Option<i64>,
) -> Result<Option<baton_engine::store::KeyClaim>, String> {
    let Some(key) = key else { return Ok(None) };
    let us = expires_us.ok_or("the idempotency key has no expiry (column `key_expires_us`)")?;
    let expires_at = DateTime::from_timestamp_micros(us)
        .ok_or_else(|| format!("column `key_expires_us` holds {us}, not a time"))?;
    Ok(Some(baton_engine::store::KeyClaim {
        key,
        request: request.unwrap_or_default(),
        expires_at,
    }))
}

/// One stored event's columns, as read.
pub(crate) struct Columns<'a> {
    pub seq: u64,
    pub at_us: i64,
    pub kind: &'a str,
    pub version: u16,
    pub level_id: Option<String>,
    pub attempt: Option<u32>,
    /// The payload, JSON text.
    pub data: &'a str,
    /// The stored hash (none when the column is empty).
    pub hash: Option<&'a [u8]>,
}

/// The event the columns hold, checked as the next link of `check` in a run of chain
/// `form`: a payload that is not JSON, a hash that does not match, a time out of range is
/// damage at that event. A run of today's form hashes the stored text as it is.
pub(crate) fn checked(
    check: &mut Check<'_>,
    run_id: &str,
    form: Form,
    c: Columns<'_>,
) -> Result<Event, Error> {
    let damaged =
        |problem: String| Error::Damaged { run_id: run_id.to_owned(), seq: c.seq, problem };
    let value: serde_json::Value;
    let payload = match form {
        Form::Encoded => Payload::Encoded(c.data.as_bytes()),
        Form::CanonicalJson => {
            value = serde_json::from_str(c.data)
                .map_err(|e| damaged(format!("its payload is not JSON ({e})")))?;
            Payload::Json(&value)
        }
    };
    let hash = c.hash.map(|h| chain::from_bytes(h).unwrap_or([0xff; 32]));
    let fields = Fields {
        seq: c.seq,
        at_us: c.at_us,
        kind: c.kind,
        version: c.version,
        level_id: c.level_id.as_deref(),
        attempt: c.attempt,
        payload,
    };
    check.event(&fields, hash.as_ref())?;
    let data = EventData::decode_str(c.kind, c.version, c.data)
        .map_err(|e| Error::Backend(format!("run {run_id} event {}: {e}", c.seq)))?;
    let at = DateTime::from_timestamp_micros(c.at_us)
        .ok_or_else(|| damaged(format!("column `at_us` holds {}, not a time", c.at_us)))?;
    Ok(Event { seq: c.seq, at, level_id: c.level_id, attempt: c.attempt, data })
}

/// How many columns a `, `-separated column list names, worked out once, at compile time
/// (the columns read after a run's are found by it on every load).
pub(crate) const fn column_count(columns: &str) -> usize {
    let bytes = columns.as_bytes();
    let (mut i, mut n) = (0, 1);
    while i < bytes.len() {
        if bytes[i] == b',' {
            n += 1;
        }
        i += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_column_list_is_counted_by_its_commas() {
        assert_eq!(super::column_count("run_id"), 1);
        assert_eq!(super::column_count("run_id, scenario_id, status"), 3);
    }
}
