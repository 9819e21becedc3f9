//! What the PostgreSQL store and its group appends share: the runs this process holds,
//! a batch of events as the append statements take it, the database's clock, the channel
//! appends notify on, and errors and parameters as both report and bind them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use baton_engine::chain::{self, Fields, Form, Hash, Payload};
use baton_engine::event::Event;
use baton_engine::store::{Error, Verified};
use chrono::{DateTime, Utc};

/// The channel every append notifies its run on (the payload is the run's id).
pub(super) const CHANNEL: &str = "baton_events";

/// The database's clock, in microseconds since the epoch: holds run out by one clock.
pub(super) const NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// The server-side deadlines of every connection, unless the URL's options set their own
/// (`?options=-c%20lock_timeout%3D5s`): no statement runs longer than a minute, none waits
/// more than 30 s for a lock another session holds, and a session left inside a
/// transaction for a minute — its process stopped or cut off while holding row locks — is
/// ended by the server, which releases them.
pub(super) const SERVER_DEADLINES: [(&str, &str); 3] = [
    ("statement_timeout", "60s"),
    ("lock_timeout", "30s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// The runs this process holds, each with its epoch and how long it surely stays its own.
pub(super) type Held = Arc<Mutex<HashMap<String, HeldRun>>>;

#[derive(Clone, Debug)]
pub(super) struct HeldRun {
    /// 0 while the hold is being taken.
    pub(super) epoch: i64,
    /// A new run's hold, taken by the statement that creates the run (no other process can
    /// know its id before): no row of `holds` names it yet.
    pub(super) pending: bool,
    /// The end of the run's log (last seq, head hash) as this process last loaded or
    /// wrote it: its next append is built on it.
    pub(super) known: Option<Verified>,
    /// Until when (this process's monotonic clock) the hold is surely still this
    /// process's: when its last renewal was sent, plus the hold's length.
    pub(super) valid_until: Arc<Mutex<std::time::Instant>>,
}

/// A database error with its server message, when there is one.
pub(super) fn db_error(e: &tokio_postgres::Error) -> String {
    use tokio_postgres::error::SqlState;
    match e.as_db_error() {
        Some(d) if [SqlState::QUERY_CANCELED, SqlState::LOCK_NOT_AVAILABLE].contains(d.code()) => {
            let deadlines: Vec<String> = SERVER_DEADLINES
                .iter()
                .map(|(setting, value)| format!("{setting} {value}"))
                .collect();
            format!(
                "{}: {} (a deadline of the connection: {} unless the URL's options set them; another session may hold the rows — a stopped or stalled process — or the server is overloaded)",
                d.severity(),
                d.message(),
                deadlines.join(", ")
            )
        }
        Some(d) => format!("{}: {}", d.severity(), d.message()),
        None => e.to_string(),
    }
}

// By value, so that it reads `.map_err(pg)`.
#[allow(clippy::needless_pass_by_value)]
pub(super) fn pg(e: tokio_postgres::Error) -> Error {
    Error::Backend(format!("postgres: {}", db_error(&e)))
}

pub(super) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub(super) fn seq_param(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A batch of events as the insert statements take it: one array per column, each event's
/// chain hash computed from the end of the log it is appended to.
pub(super) struct Batch {
    pub(super) seqs: Vec<i64>,
    pub(super) ats: Vec<i64>,
    pub(super) kinds: Vec<&'static str>,
    pub(super) versions: Vec<i32>,
    pub(super) levels: Vec<Option<String>>,
    pub(super) attempts: Vec<Option<i64>>,
    pub(super) datas: Vec<String>,
    pub(super) hashes: Vec<Vec<u8>>,
    /// The run's last seq and head hash once the batch is appended.
    pub(super) last_seq: u64,
    pub(super) head: Hash,
    pub(super) form: Form,
    pub(super) updated_us: i64,
    /// `last_seq` and `head` as the statements take them.
    pub(super) last_param: i64,
    pub(super) head_param: Vec<u8>,
}

impl Batch {
    pub(super) fn new(events: &[Event], end: Verified) -> Batch {
        let n = events.len();
        let mut b = Batch {
            seqs: Vec::with_capacity(n),
            ats: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n),
            versions: Vec::with_capacity(n),
            levels: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            datas: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
            last_seq: end.last_seq + n as u64,
            head: end.head,
            form: end.form,
            updated_us: micros(events.last().map_or_else(Utc::now, |e| e.at)),
            last_param: 0,
            head_param: Vec::new(),
        };
        for e in events {
            // The text stored is the payload's encoding, which a run of today's form
            // hashes as it is; a run of the older form hashes its value's canonical JSON.
            let data = e.data.encode();
            b.head = match end.form {
                Form::Encoded => chain::link(&b.head, &Fields::of(e, Payload::Encoded(&data))),
                Form::CanonicalJson => {
                    let payload = serde_json::from_slice(&data).unwrap_or_default();
                    chain::link(&b.head, &Fields::of(e, Payload::Json(&payload)))
                }
            };
            b.seqs.push(seq_param(e.seq));
            b.ats.push(micros(e.at));
            b.kinds.push(e.data.kind());
            b.versions.push(i32::from(baton_engine::event::VERSION));
            b.levels.push(e.level_id.clone());
            b.attempts.push(e.attempt.map(i64::from));
            // Encoded from plain data, the payload is UTF-8 JSON text.
            b.datas.push(String::from_utf8(data).unwrap_or_default());
            b.hashes.push(b.head.to_vec());
        }
        b.last_param = seq_param(b.last_seq);
        b.head_param = b.head.to_vec();
        b
    }

    /// Parameters `$1` to `$13` of both append statements.
    pub(super) fn params<'p>(
        &'p self,
        run_id: &'p &'p str,
        status: &'p &'p str,
    ) -> Vec<&'p (dyn tokio_postgres::types::ToSql + Sync)> {
        vec![
            run_id,
            &self.seqs,
            &self.ats,
            &self.kinds,
            &self.versions,
            &self.levels,
            &self.attempts,
            &self.datas,
            &self.hashes,
            &self.last_param,
            status,
            &self.updated_us,
            &self.head_param,
        ]
    }
}

/// Remembers where a run this process holds ends (after a whole load or an append).
pub(super) fn knows(held: &Held, run_id: &str, end: Verified) {
    if let Some(run) = lock(held).get_mut(run_id) {
        run.known = Some(end);
    }
}

impl Batch {
    /// The end of the run's log once the batch is appended.
    pub(super) fn end(&self) -> Verified {
        Verified { last_seq: self.last_seq, head: self.head, form: self.form }
    }
}
