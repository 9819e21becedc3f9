//! How the SQLite store keeps a run's log: one row of `batches` per commit batch, its
//! events packed into one blob ([`crate::packed`]), keyed by the run's integer key `rk`;
//! the `kinds` and `shapes` dictionaries the blobs refer to; the chain hash of each batch's
//! last event. Appending, loading with every check, the migration of the per-event rows of
//! schema 6, and a raw view of the batches for tools and tests that edit a log by hand.

use std::collections::HashMap;
use std::sync::Arc;

use baton_engine::chain::{self, Check, Fields, Form, GENESIS, Hash, Payload};
use baton_engine::event::{Event, EventData, VERSION};
use baton_engine::store::{Error, FeedCursor, FeedRef, Verified, check_numbering};
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use crate::packed::{self, Intern, Resolve, RunStrings, Unpacked};

/// Shapes the dictionary takes before objects with new key lists are written with their
/// keys inline: user data (metadata, parsed outputs) cannot grow it without bound.
const SHAPES_MAX: i64 = 4096;

/// Shared strings a writer remembers over every run before it forgets them all (each is
/// 16 bytes of digest and a place).
const STRINGS_MAX: usize = 200_000;

/// Events migrated into one batch from the per-event rows of schema 6.
const MIGRATED_BATCH: usize = 64;

/// One connection's copy of the dictionaries, filled as codes are met. Both only grow and
/// never renumber, so a copy is never wrong, only incomplete.
#[derive(Debug, Default)]
pub(crate) struct Dicts {
    kind_codes: HashMap<String, u64>,
    kind_names: HashMap<u64, String>,
    shape_ids: HashMap<String, u64>,
    shapes: HashMap<u64, Arc<[String]>>,
    /// Whether the shapes table was found full (then no new shape is tried).
    shapes_full: bool,
    /// A buffer for [`shape_key`].
    key: String,
}

/// A key list as one string for the cache: each key after its length, so that no two
/// lists make the same string.
fn shape_key<'k>(keys: impl Iterator<Item = &'k str>, out: &mut String) {
    use std::fmt::Write as _;
    out.clear();
    for k in keys {
        let _ = write!(out, "{}:", k.len());
        out.push_str(k);
    }
}

/// The writer's state: its dictionaries and the shared strings of the runs it appends to.
#[derive(Debug, Default)]
pub(crate) struct Packer {
    dicts: Dicts,
    runs: HashMap<i64, RunStrings>,
    strings: usize,
}

impl Packer {
    /// Forgets everything: after a write that was rolled back, codes and strings it added
    /// may no longer be in the database.
    pub(crate) fn reset(&mut self) {
        *self = Packer::default();
    }

    pub(crate) fn dicts(&mut self) -> &mut Dicts {
        &mut self.dicts
    }
}

/// [`Intern`] over a connection: codes come from the cache or are added to the tables in
/// the writer's transaction.
struct Interner<'a> {
    conn: &'a Connection,
    dicts: &'a mut Dicts,
}

impl Intern for Interner<'_> {
    fn kind(&mut self, name: &str) -> Result<u64, String> {
        if let Some(&code) = self.dicts.kind_codes.get(name) {
            return Ok(code);
        }
        let code: i64 = self
            .conn
            .prepare_cached(
                "INSERT INTO kinds (name) VALUES (?1) ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING code",
            )
            .and_then(|mut s| s.query_row([name], |r| r.get(0)))
            .map_err(|e| format!("cannot number the event kind `{name}`: {e}"))?;
        let code = code as u64;
        self.dicts.kind_codes.insert(name.to_owned(), code);
        self.dicts.kind_names.insert(code, name.to_owned());
        Ok(code)
    }

    fn shape(&mut self, keys: &[&str]) -> Result<Option<u64>, String> {
        let mut key = std::mem::take(&mut self.dicts.key);
        shape_key(keys.iter().copied(), &mut key);
        let known = self.dicts.shape_ids.get(&key).copied();
        self.dicts.key = key;
        if let Some(id) = known {
            return Ok(Some(id));
        }
        let text = serde_json::to_string(keys).map_err(|e| e.to_string())?;
        let found: Option<i64> = self
            .conn
            .prepare_cached("SELECT id FROM shapes WHERE keys = ?1")
            .and_then(|mut s| s.query_row([&text], |r| r.get(0)).optional())
            .map_err(|e| format!("cannot read the shapes table: {e}"))?;
        let id = match found {
            Some(id) => id,
            None if self.dicts.shapes_full => return Ok(None),
            None => {
                let count: i64 = self
                    .conn
                    .prepare_cached("SELECT COUNT(*) FROM shapes")
                    .and_then(|mut s| s.query_row([], |r| r.get(0)))
                    .map_err(|e| format!("cannot read the shapes table: {e}"))?;
                if count >= SHAPES_MAX {
                    self.dicts.shapes_full = true;
                    return Ok(None);
                }
                self.conn
                    .prepare_cached("INSERT INTO shapes (keys) VALUES (?1) RETURNING id")
                    .and_then(|mut s| s.query_row([&text], |r| r.get(0)))
                    .map_err(|e| format!("cannot add to the shapes table: {e}"))?
            }
        };
        let id = id as u64;
        self.dicts.shape_ids.insert(self.dicts.key.clone(), id);
        self.dicts.shapes.insert(id, keys.iter().map(|k| (*k).to_owned()).collect());
        Ok(Some(id))
    }
}

/// [`Resolve`] over a connection, for one run: dictionary codes from the cache or the
/// tables, shared strings of other batches from the batches already read or the table.
struct Resolver<'a> {
    conn: &'a Connection,
    dicts: &'a mut Dicts,
    rk: i64,
    /// The shared strings of each batch read so far, by first seq.
    batches: HashMap<u64, Vec<String>>,
}

/// The text a dictionary table keeps under `id` (`sql` selects it by `?1`), if any.
fn entry(conn: &Connection, sql: &str, id: u64) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached(sql)?.query_row([id as i64], |r| r.get(0)).optional()
}

impl Resolve for Resolver<'_> {
    fn kind(&mut self, code: u64) -> Result<String, String> {
        if let Some(name) = self.dicts.kind_names.get(&code) {
            return Ok(name.clone());
        }
        let name = entry(self.conn, "SELECT name FROM kinds WHERE code = ?1", code)
            .map_err(|e| format!("cannot read the kinds table: {e}"))?
            .ok_or_else(|| {
                format!("an event of kind code {code}, which the kinds table does not hold")
            })?;
        self.dicts.kind_names.insert(code, name.clone());
        self.dicts.kind_codes.insert(name.clone(), code);
        Ok(name)
    }

    fn shape(&mut self, id: u64) -> Result<Arc<[String]>, String> {
        if let Some(keys) = self.dicts.shapes.get(&id) {
            return Ok(Arc::clone(keys));
        }
        let text = entry(self.conn, "SELECT keys FROM shapes WHERE id = ?1", id)
            .map_err(|e| format!("cannot read the shapes table: {e}"))?
            .ok_or_else(|| {
                format!("an object of shape {id}, which the shapes table does not hold")
            })?;
        let keys: Vec<String> = serde_json::from_str(&text)
            .map_err(|e| format!("shape {id} of the shapes table is not a list of keys: {e}"))?;
        let keys: Arc<[String]> = keys.into();
        let mut key = String::new();
        shape_key(keys.iter().map(String::as_str), &mut key);
        self.dicts.shapes.insert(id, Arc::clone(&keys));
        self.dicts.shape_ids.insert(key, id);
        Ok(keys)
    }

    fn shared(&mut self, batch: u64, ordinal: u32) -> Result<String, String> {
        if !self.batches.contains_key(&batch) {
            let row: Option<(i64, Vec<u8>)> = self
                .conn
                .prepare_cached("SELECT at_us, body FROM batches WHERE rk = ?1 AND first_seq = ?2")
                .and_then(|mut s| {
                    s.query_row(params![self.rk, batch as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .map_err(|e| format!("cannot read the batch at {batch}: {e}"))?;
            let (at_us, body) = row.ok_or_else(|| {
                format!("a reference to the batch at {batch}, which is not stored")
            })?;
            let strings = packed::shared_strings(batch, at_us, &body, self).map_err(|e| {
                format!("a reference to the batch at {batch}, which cannot be read: {e}")
            })?;
            self.batches.insert(batch, strings);
        }
        self.batches.get(&batch).and_then(|s| s.get(ordinal as usize)).cloned().ok_or_else(|| {
            format!(
                "a reference to string {ordinal} of the batch at {batch}, which it does not hold"
            )
        })
    }
}

/// The end of a run's log as an append builds on it: the run's key, its `last_seq` and head
/// hash, checked against the stored hash of its last batch (a whole-log check is `load`'s
/// job; this one costs two rows).
pub(crate) fn end_of_log(conn: &Connection, run_id: &str) -> Result<(i64, Verified), Error> {
    let row = conn
        .prepare_cached("SELECT rk, last_seq, head_hash, chain FROM runs WHERE run_id = ?1")
        .and_then(|mut s| {
            s.query_row([run_id], |r| {
                Ok((
                    r.get::<_, i64>(0),
                    crate::sqlite_rows::named::<i64>(r, 1, "last_seq", "an integer"),
                    crate::sqlite_rows::named::<Option<Vec<u8>>>(r, 2, "head_hash", "a blob"),
                    r.get::<_, i64>(3).unwrap_or(0),
                ))
            })
            .optional()
        })
        .map_err(crate::sqlite_rows::backend)?;
    let Some((rk, last, head, form)) = row else {
        return Err(Error::NotFound(run_id.to_owned()));
    };
    let rk = rk.map_err(crate::sqlite_rows::backend)?;
    let form = Form::from_number(form).ok_or_else(|| Form::unknown(run_id, form))?;
    let damaged =
        |seq: u64, problem: String| Error::Damaged { run_id: run_id.to_owned(), seq, problem };
    let last = last.map_err(|p| damaged(1, format!("the run's record: {p}")))?;
    let last = u64::try_from(last)
        .map_err(|_| damaged(1, format!("the run's record says it has {last} events")))?;
    let head = head.map_err(|p| damaged(last + 1, format!("the run's record: {p}")))?;
    let head = head.as_deref().and_then(chain::from_bytes).ok_or_else(|| {
        damaged(last + 1, "the run's record has no head hash (or not a 32-byte one)".to_owned())
    })?;
    let stored: Option<(i64, Hash)> = if last == 0 {
        None
    } else {
        conn.prepare_cached(
            "SELECT last_seq, hash FROM batches WHERE rk = ?1 ORDER BY first_seq DESC LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row([rk], |r| {
                let hash = r.get::<_, Option<Vec<u8>>>(1).ok().flatten();
                Ok((
                    r.get::<_, i64>(0).unwrap_or(-1),
                    hash.as_deref().and_then(chain::from_bytes).unwrap_or([0xff; 32]),
                ))
            })
            .optional()
        })
        .map_err(crate::sqlite_rows::backend)?
    };
    match stored {
        None if last == 0 => Ok((rk, Verified { last_seq: 0, head: GENESIS, form })),
        None => Err(damaged(last, format!("the event is missing: the run records {last} events"))),
        Some((end, _)) if end != last as i64 => Err(damaged(
            (end.max(0) as u64 + 1).min(last),
            format!("the run records {last} events, its last batch ends at {end}"),
        )),
        Some((_, h)) if h != head => Err(damaged(
            last + 1,
            format!(
                "the run's head hash does not match event {last}: events after it were lost or the run's record was changed"
            ),
        )),
        Some(_) => Ok((rk, Verified { last_seq: last, head, form })),
    }
}

/// Where an append of `events` (numbered from `expected`) to a run would go: the run's key
/// and the end of its log, checked; refused, with nothing written, on a conflict, a
/// misnumbered batch or a damaged end.
pub(crate) fn check_append(
    conn: &Connection,
    run_id: &str,
    expected: u64,
    events: &[Event],
) -> Result<(i64, Verified), Error> {
    let (rk, end) = end_of_log(conn, run_id)?;
    let actual = end.last_seq + 1;
    if actual != expected {
        return Err(Error::Conflict { run_id: run_id.to_owned(), expected, actual });
    }
    check_numbering(events, expected)?;
    Ok((rk, end))
}

/// Appends `events` (numbered from `expected`) to a run as one batch row and moves the
/// run's record to its new end, in the caller's transaction.
pub(crate) fn append(
    conn: &Connection,
    packer: &mut Packer,
    run_id: &str,
    expected: u64,
    events: &[Event],
    status: &str,
) -> Result<(), Error> {
    let end = check_append(conn, run_id, expected, events)?;
    write_batch(conn, packer, end, events, &ready(events), status)
}

/// Writes `events` as the batch after `end` (what [`check_append`] found) and moves the
/// run's record to its new end. A failure resets `packer`: what it learnt may be rolled
/// back with the transaction.
pub(crate) fn write_batch(
    conn: &Connection,
    packer: &mut Packer,
    end: (i64, Verified),
    events: &[Event],
    ready: &[Ready],
    status: &str,
) -> Result<(), Error> {
    if events.is_empty() {
        return Ok(());
    }
    // The deliveries the events cause go in with them, in the same transaction.
    let written =
        write_packed(conn, packer, (end.0, end.1.head, end.1.form), events, ready, status)
            .and_then(|()| crate::sqlite_webhooks::enqueue(conn, end.0, events));
    if written.is_err() {
        packer.reset();
    }
    written
}

/// An event made ready for the writer on the thread that appends it: its payload's
/// encoding, which the chain hashes ([`Form::Encoded`]) and the packer packs as it is, so
/// that the writer thread, which every append of the process waits on, only hashes and
/// packs.
#[derive(Debug)]
pub(crate) struct Ready {
    encoded: Vec<u8>,
}

/// `events` made ready for [`write_batch`].
pub(crate) fn ready(events: &[Event]) -> Vec<Ready> {
    events.iter().map(|e| Ready { encoded: e.data.encode() }).collect()
}

fn write_packed(
    conn: &Connection,
    packer: &mut Packer,
    (rk, prev, form): (i64, Hash, Form),
    events: &[Event],
    ready: &[Ready],
    status: &str,
) -> Result<(), Error> {
    if ready.len() != events.len() {
        return Err(Error::Backend("an append's events were not all made ready".to_owned()));
    }
    let mut hash = prev;
    let mut refs = Vec::with_capacity(events.len());
    for (e, r) in events.iter().zip(ready) {
        // A run of the older form hashes its payloads' canonical JSON, read back here.
        let value: serde_json::Value;
        let payload = match form {
            Form::Encoded => Payload::Encoded(&r.encoded),
            Form::CanonicalJson => {
                value = serde_json::from_slice(&r.encoded)
                    .map_err(|e| Error::Backend(format!("an event's encoding is not JSON: {e}")))?;
                Payload::Json(&value)
            }
        };
        hash = chain::link(&hash, &Fields::of(e, payload));
        refs.push(packed::EventRef {
            at_us: e.at.timestamp_micros(),
            kind: e.data.kind(),
            version: VERSION,
            level_id: e.level_id.as_deref(),
            attempt: e.attempt,
            payload: &r.encoded,
        });
    }
    let first = events[0].seq;
    let last = events[events.len() - 1].seq;
    let at_us = refs[0].at_us;
    if packer.strings > STRINGS_MAX {
        packer.runs.clear();
        packer.strings = 0;
    }
    let Packer { dicts, runs, strings } = packer;
    let known = runs.entry(rk).or_default();
    let before = known.len();
    let body = packed::pack(first, at_us, &refs, &mut Interner { conn, dicts }, Some(known))
        .map_err(crate::sqlite_rows::backend)?;
    *strings += known.len() - before;
    if matches!(status, "completed" | "failed" | "aborted" | "cancelled") {
        // An ended run takes no more appends from its driver: forget its strings.
        if let Some(gone) = runs.remove(&rk) {
            *strings -= gone.len();
        }
    }
    let writer = baton_engine::store::writer();
    conn.prepare_cached(
        "INSERT INTO batches (rk, first_seq, last_seq, at_us, body, hash, writer) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![rk, first as i64, last as i64, at_us, body, hash.as_slice(), &*writer])
    })
    .map_err(crate::sqlite_rows::backend)?;
    let updated = events[events.len() - 1].at;
    // The newest event version the log holds (this build writes its own): no worker that
    // reads only older ones claims it.
    let version = baton_engine::event::VERSION;
    conn.prepare_cached(
        "UPDATE runs SET last_seq = ?2, status = ?3, updated_at = ?4, head_hash = ?5,
            events_version = MAX(events_version, ?6) WHERE rk = ?1",
    )
    .and_then(|mut s| {
        s.execute(params![
            rk,
            last as i64,
            status,
            updated.timestamp_micros(),
            hash.as_slice(),
            version
        ])
    })
    .map_err(crate::sqlite_rows::backend)?;
    Ok(())
}

/// The feed after `after` (`major` a batch's place in the `feed` table, `minor` the last
/// event of that batch already given): at most `limit` events of `tenant`'s runs (every
/// run's when `None`), batch by batch in commit order.
pub(crate) fn feed(
    conn: &Connection,
    tenant: &Option<Option<String>>,
    after: FeedCursor,
    limit: usize,
) -> Result<Vec<FeedRef>, Error> {
    let backend = crate::sqlite_rows::backend;
    let (filtered, tenant) = match tenant {
        Some(t) => (true, t.as_deref()),
        None => (false, None),
    };
    let Ok(major) = i64::try_from(after.major) else { return Ok(Vec::new()) };
    // One batch more than the limit: the first may hold only events already given.
    let batches = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(
            "SELECT f.pos, r.run_id, f.first_seq, f.last_seq FROM feed f JOIN runs r ON r.rk = f.rk
              WHERE f.pos >= ?1 AND (?2 = 0 OR r.tenant IS ?3)
              ORDER BY f.pos LIMIT ?4",
        )
        .map_err(backend)?;
    let rows = stmt
        .query_map(params![major, filtered, tenant, batches], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (pos, run_id, first, last) = row.map_err(backend)?;
        let pos = u64::try_from(pos).unwrap_or_default();
        for seq in
            u64::try_from(first).unwrap_or_default()..=u64::try_from(last).unwrap_or_default()
        {
            if pos == after.major && seq <= after.minor {
                continue;
            }
            if out.len() == limit {
                return Ok(out);
            }
            out.push(FeedRef {
                cursor: FeedCursor { major: pos, minor: seq },
                run_id: run_id.clone(),
                seq,
            });
        }
    }
    Ok(out)
}

/// The run's events after `after`, checked against the chain and the run's record — both
/// read in one snapshot: read apart, another process's commit between the two reads would
/// look like a damaged log.
pub(crate) fn load_checked(
    conn: &Connection,
    dicts: &mut Dicts,
    run_id: &str,
    after: u64,
) -> Result<(Vec<Event>, Verified), Error> {
    // A deferred transaction that only reads: its snapshot is taken at the first read and
    // kept to the last; dropping it ends it. (Inside a caller's transaction, that one's.)
    let _snapshot = if conn.is_autocommit() {
        Some(conn.unchecked_transaction().map_err(crate::sqlite_rows::backend)?)
    } else {
        None
    };
    let Some((record, head, rk, form)) = crate::sqlite_rows::run_for_load(conn, run_id)? else {
        return Err(Error::NotFound(run_id.to_owned()));
    };
    let damaged =
        |seq: u64, problem: String| Error::Damaged { run_id: run_id.to_owned(), seq, problem };
    if after > 0 && after >= record.last_seq {
        return Ok((Vec::new(), Verified { last_seq: record.last_seq, head: GENESIS, form }));
    }
    // The batch holding event `after + 1`, and the hash the chain resumes from.
    let start: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(MAX(first_seq), 1) FROM batches WHERE rk = ?1 AND first_seq <= ?2",
        )
        .and_then(|mut s| s.query_row(params![rk, after as i64 + 1], |r| r.get(0)))
        .map_err(crate::sqlite_rows::backend)?;
    let start = u64::try_from(start).unwrap_or(1).max(1);
    let prev = if start == 1 {
        GENESIS
    } else {
        let before: Option<(Option<i64>, Option<Vec<u8>>)> = conn
            .prepare_cached(
                "SELECT last_seq, hash FROM batches WHERE rk = ?1 AND first_seq < ?2 ORDER BY first_seq DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![rk, start as i64], |r| {
                    Ok((r.get(0).ok(), r.get(1).ok()))
                })
                .optional()
            })
            .map_err(crate::sqlite_rows::backend)?;
        match before {
            Some((Some(end), Some(hash))) if end == start as i64 - 1 => chain::from_bytes(&hash)
                .ok_or_else(|| {
                    damaged(start - 1, "its batch has no hash (or not a 32-byte one)".to_owned())
                })?,
            _ => return Err(damaged(start - 1, "the event is missing".to_owned())),
        }
    };
    let mut check = Check::new(run_id, start - 1, prev);
    let mut resolver = Resolver { conn, dicts, rk, batches: HashMap::new() };
    let mut stmt = conn
        .prepare_cached(
            "SELECT first_seq, last_seq, at_us, body, hash FROM batches WHERE rk = ?1 AND first_seq >= ?2 ORDER BY first_seq",
        )
        .map_err(crate::sqlite_rows::backend)?;
    let mut rows = stmt.query(params![rk, start as i64]).map_err(crate::sqlite_rows::backend)?;
    let mut events = Vec::new();
    while let Some(r) = rows.next().map_err(crate::sqlite_rows::backend)? {
        let next = check.next_seq();
        let named = crate::sqlite_rows::named::<i64>;
        let first = named(r, 0, "first_seq", "an integer")
            .map_err(|p| damaged(next, format!("the batch after event {}: {p}", next - 1)))?;
        let first = u64::try_from(first).map_err(|_| {
            damaged(next, format!("the batch after event {} starts at {first}", next - 1))
        })?;
        check.seq(first)?;
        let column = |p: String| damaged(first, format!("its batch: {p}"));
        let last = named(r, 1, "last_seq", "an integer").map_err(column)?;
        let at_us = named(r, 2, "at_us", "an integer").map_err(column)?;
        let body = crate::sqlite_rows::named::<Vec<u8>>(r, 3, "body", "a blob").map_err(column)?;
        let hash = crate::sqlite_rows::named::<Vec<u8>>(r, 4, "hash", "a blob").map_err(column)?;
        let hash = chain::from_bytes(&hash)
            .ok_or_else(|| damaged(first, "its batch's hash is not 32 bytes".to_owned()))?;
        let batch = packed::unpack(first, at_us, &body, &mut resolver)
            .map_err(|p| damaged(first, format!("its batch cannot be read: {p}")))?;
        if last < first as i64 || (last as u64 - first + 1) != batch.events.len() as u64 {
            return Err(damaged(
                first,
                format!(
                    "its batch says it holds events {first} to {last} but holds {}",
                    batch.events.len()
                ),
            ));
        }
        // The whole batch is checked against its hash before any of it is believed.
        for (seq, e) in (first..).zip(&batch.events) {
            // The batch unpacks to the very text the append encoded.
            let value: serde_json::Value;
            let payload = match form {
                Form::Encoded => Payload::Encoded(&e.payload),
                Form::CanonicalJson => {
                    value = serde_json::from_slice(&e.payload)
                        .map_err(|err| damaged(seq, format!("its payload is not JSON ({err})")))?;
                    Payload::Json(&value)
                }
            };
            check.pass(&Fields {
                seq,
                at_us: e.at_us,
                kind: &e.kind,
                version: e.version,
                level_id: e.level_id.as_deref(),
                attempt: e.attempt,
                payload,
            })?;
        }
        check.settle(first, &hash)?;
        for (seq, e) in (first..).zip(batch.events) {
            if seq <= after {
                continue;
            }
            let data = EventData::decode_bytes(&e.kind, e.version, &e.payload)
                .map_err(|err| Error::Backend(format!("run {run_id} event {seq}: {err}")))?;
            let at = DateTime::<Utc>::from_timestamp_micros(e.at_us)
                .ok_or_else(|| damaged(seq, format!("its time, {} µs, is not a time", e.at_us)))?;
            events.push(Event { seq, at, level_id: e.level_id, attempt: e.attempt, data });
        }
        resolver.batches.insert(first, batch.shared);
    }
    let last_seq = check.finish(record.last_seq, head.as_ref())?;
    Ok((events, Verified { last_seq, head: head.unwrap_or(GENESIS), form }))
}

/// Migration 0007: packs the per-event rows of every run into batches and drops them. A
/// run whose old chain holds is packed in batches of [`MIGRATED_BATCH`] events; from the
/// first event that breaks it on, each event becomes a batch of its own that keeps the
/// event's old hash, so loading the run reports the same damage at the same event.
pub(crate) fn pack_existing_runs(conn: &Connection) -> rusqlite::Result<()> {
    // The runs' times, copied as text, become microseconds.
    let times: Vec<(i64, String, String)> = conn
        .prepare("SELECT rk, CAST(created_at AS TEXT), CAST(updated_at AS TEXT) FROM runs")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let micros = |s: &str| {
        DateTime::parse_from_rfc3339(s).map(|t| t.timestamp_micros()).map_err(|e| {
            rusqlite::Error::ToSqlConversionFailure(
                format!("a run's time {s:?} is not an RFC 3339 time: {e}").into(),
            )
        })
    };
    for (rk, created, updated) in times {
        conn.execute(
            "UPDATE runs SET created_at = ?2, updated_at = ?3 WHERE rk = ?1",
            params![rk, micros(&created)?, micros(&updated)?],
        )?;
    }
    let runs: Vec<(i64, String)> = conn
        .prepare("SELECT rk, run_id FROM runs ORDER BY rk")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut rows = conn.prepare(
        "SELECT seq, at_us, kind, version, level_id, attempt, data, hash FROM events WHERE run_id = ?1 ORDER BY seq",
    )?;
    let mut dicts = Dicts::default();
    for (rk, run_id) in runs {
        let mut old = Vec::new();
        let mut q = rows.query([&run_id])?;
        while let Some(r) = q.next()? {
            use rusqlite::types::Value as V;
            let int = |i: usize| match r.get::<_, V>(i) {
                Ok(V::Integer(n)) => Some(n),
                _ => None,
            };
            let text = |i: usize| match r.get::<_, V>(i) {
                Ok(V::Text(s)) => Some(s),
                Ok(V::Blob(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                _ => None,
            };
            let data = text(6).unwrap_or_default();
            let hash = match r.get::<_, V>(7) {
                Ok(V::Blob(b)) => chain::from_bytes(&b),
                _ => None,
            };
            old.push((
                int(0).unwrap_or(-1),
                Unpacked {
                    at_us: int(1).unwrap_or(0),
                    kind: text(2).unwrap_or_default(),
                    version: int(3).and_then(|v| u16::try_from(v).ok()).unwrap_or(0),
                    level_id: text(4),
                    attempt: int(5).and_then(|a| u32::try_from(a).ok()),
                    // A payload that is not JSON is kept as a string: it no longer matches
                    // its hash, which is how it was damaged before.
                    payload: match serde_json::from_str::<serde::de::IgnoredAny>(&data) {
                        Ok(_) => data.into_bytes(),
                        Err(_) => serde_json::to_vec(&data).unwrap_or_default(),
                    },
                },
                hash,
            ));
        }
        drop(q);
        // How far the old chain holds.
        let mut prev = GENESIS;
        let mut intact = 0;
        for (i, (seq, e, stored)) in old.iter().enumerate() {
            if *seq != i as i64 + 1 {
                break;
            }
            let payload: serde_json::Value =
                serde_json::from_slice(&e.payload).unwrap_or(serde_json::Value::Null);
            let fields = Fields {
                seq: *seq as u64,
                at_us: e.at_us,
                kind: &e.kind,
                version: e.version,
                level_id: e.level_id.as_deref(),
                attempt: e.attempt,
                payload: Payload::Json(&payload),
            };
            let h = chain::link(&prev, &fields);
            if Some(h) != *stored {
                break;
            }
            prev = h;
            intact = i + 1;
        }
        let mut known = RunStrings::default();
        let mut start = 0;
        while start < old.len() {
            let end = if start < intact { (start + MIGRATED_BATCH).min(intact) } else { start + 1 };
            let group = &old[start..end];
            let (first, _, _) = &group[0];
            let (last, _, hash) = &group[group.len() - 1];
            let events: Vec<packed::EventRef<'_>> =
                group.iter().map(|(_, e, _)| e.as_ref()).collect();
            let at_us = events[0].at_us;
            let body = packed::pack(
                *first as u64,
                at_us,
                &events,
                &mut Interner { conn, dicts: &mut dicts },
                Some(&mut known),
            )
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
            let hash = hash.unwrap_or([0xff; 32]);
            conn.execute(
                "INSERT INTO batches (rk, first_seq, last_seq, at_us, body, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![rk, first, last, at_us, body, hash.as_slice()],
            )?;
            start = end;
        }
    }
    drop(rows);
    conn.execute_batch("DROP TABLE events")
}

/// One stored batch, unpacked as it is: for tools and tests that look at or edit a log by
/// hand (its hash is what is stored, not recomputed).
#[derive(Clone, Debug, PartialEq)]
pub struct RawBatch {
    pub first_seq: i64,
    pub last_seq: i64,
    pub at_us: i64,
    pub hash: Vec<u8>,
    pub events: Vec<RawEvent>,
}

/// One event of a [`RawBatch`]: its envelope and its payload as a JSON value.
#[derive(Clone, Debug, PartialEq)]
pub struct RawEvent {
    pub at_us: i64,
    pub kind: String,
    pub version: u16,
    pub level_id: Option<String>,
    pub attempt: Option<u32>,
    pub payload: serde_json::Value,
}

/// A batch row as read: first and last seq, time, body, hash.
type RawRow = (i64, i64, i64, Vec<u8>, Vec<u8>);

/// The batches of run `run_id` in the database `conn` is open on, in order.
pub fn raw_batches(conn: &Connection, run_id: &str) -> Result<Vec<RawBatch>, String> {
    let rk: i64 = conn
        .query_row("SELECT rk FROM runs WHERE run_id = ?1", [run_id], |r| r.get(0))
        .map_err(|e| format!("run {run_id}: {e}"))?;
    let rows: Vec<RawRow> = conn
        .prepare("SELECT first_seq, last_seq, at_us, body, hash FROM batches WHERE rk = ?1 ORDER BY first_seq")
        .and_then(|mut s| {
            s.query_map([rk], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?
                .collect()
        })
        .map_err(|e| e.to_string())?;
    let mut dicts = Dicts::default();
    let mut resolver = Resolver { conn, dicts: &mut dicts, rk, batches: HashMap::new() };
    let mut out = Vec::new();
    for (first_seq, last_seq, at_us, body, hash) in rows {
        let batch = packed::unpack(first_seq as u64, at_us, &body, &mut resolver)?;
        resolver.batches.insert(first_seq as u64, batch.shared);
        let events = batch
            .events
            .into_iter()
            .map(|e| RawEvent {
                at_us: e.at_us,
                kind: e.kind,
                version: e.version,
                level_id: e.level_id,
                attempt: e.attempt,
                payload: serde_json::from_slice(&e.payload).unwrap_or(serde_json::Value::Null),
            })
            .collect();
        out.push(RawBatch { first_seq, last_seq, at_us, hash, events });
    }
    Ok(out)
}

/// Replaces the batches of run `run_id` with `batches`, packed as given (every string
/// inline, no hash recomputed): an edit by hand, as damage would make it.
pub fn put_raw_batches(
    conn: &Connection,
    run_id: &str,
    batches: &[RawBatch],
) -> Result<(), String> {
    let rk: i64 = conn
        .query_row("SELECT rk FROM runs WHERE run_id = ?1", [run_id], |r| r.get(0))
        .map_err(|e| format!("run {run_id}: {e}"))?;
    let mut dicts = Dicts::default();
    conn.execute("DELETE FROM batches WHERE rk = ?1", [rk]).map_err(|e| e.to_string())?;
    for b in batches {
        let body = if b.events.is_empty() {
            vec![packed::FORMAT, 0]
        } else {
            let texts: Vec<Vec<u8>> = b
                .events
                .iter()
                .map(|e| serde_json::to_vec(&e.payload).unwrap_or_default())
                .collect();
            let refs: Vec<_> = b
                .events
                .iter()
                .zip(&texts)
                .map(|(e, text)| packed::EventRef {
                    at_us: e.at_us,
                    kind: &e.kind,
                    version: e.version,
                    level_id: e.level_id.as_deref(),
                    attempt: e.attempt,
                    payload: text,
                })
                .collect();
            packed::pack(
                b.first_seq.max(0) as u64,
                b.at_us,
                &refs,
                &mut Interner { conn, dicts: &mut dicts },
                None,
            )?
        };
        conn.execute(
            "INSERT INTO batches (rk, first_seq, last_seq, at_us, body, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![rk, b.first_seq, b.last_seq, b.at_us, body, b.hash],
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
