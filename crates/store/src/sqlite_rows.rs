//! Reading the SQLite store's rows: a run's record from its columns, a column read with
//! what it holds when it cannot be read, and errors as the store reports them — shared by
//! the store (`sqlite`) and its packed log (`sqlite_log`).

use baton_engine::chain::{self, Hash};
use baton_engine::store::{Error, Placement, RunRecord};
use chrono::{DateTime, Utc};
use rusqlite::types::{FromSql, Type};
use rusqlite::{Connection, OptionalExtension, Row};

/// The store's error for a failure of SQLite itself.
pub(crate) fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

/// Reads column `i` (called `name`, meant to hold `expected`), saying what it holds instead
/// when it cannot be read: "column `attempt` holds text, where an integer belongs", never
/// "Invalid column type Text at index: 5".
pub(crate) fn named<T: FromSql>(
    r: &Row<'_>,
    i: usize,
    name: &str,
    expected: &str,
) -> Result<T, String> {
    fn what(t: Type) -> &'static str {
        match t {
            Type::Null => "null",
            Type::Integer => "an integer",
            Type::Real => "a real number",
            Type::Text => "text",
            Type::Blob => "a blob",
        }
    }
    r.get::<_, T>(i).map_err(|e| match e {
        rusqlite::Error::InvalidColumnType(_, _, t) => {
            format!("column `{name}` holds {}, where {expected} belongs", what(t))
        }
        rusqlite::Error::IntegralValueOutOfRange(_, v) => {
            format!("column `{name}` holds {v}, out of range for {expected}")
        }
        rusqlite::Error::FromSqlConversionFailure(_, t, e) => {
            format!("column `{name}` holds {} that is not {expected}: {e}", what(t))
        }
        other => format!("column `{name}` cannot be read: {other}"),
    })
}

/// `query_row` through the connection's statement cache: the hot statements are parsed once
/// per connection.
pub(crate) fn cached_row<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}

/// A run's record read from a row of [`RUN_COLUMNS`], with its head hash (`None` when it
/// has none); a column that cannot be read is reported with the run's id and its name.
pub(crate) fn to_record(r: &Row<'_>) -> rusqlite::Result<Result<(RunRecord, Option<Hash>), Error>> {
    let run_id = match named::<String>(r, 0, "run_id", "text") {
        Ok(id) => id,
        Err(p) => return Ok(Err(Error::Backend(format!("a run in the database: {p}")))),
    };
    let fail = |p: String| Error::Damaged {
        run_id: run_id.clone(),
        seq: 1,
        problem: format!("the run's record: {p}"),
    };
    let read = || -> Result<(RunRecord, Option<Hash>), String> {
        let last_seq = named::<i64>(r, 5, "last_seq", "an integer")?;
        let head = named::<Option<Vec<u8>>>(r, 6, "head_hash", "a blob")?;
        Ok((
            RunRecord {
                run_id: run_id.clone(),
                scenario_id: named(r, 1, "scenario_id", "text")?,
                status: named(r, 2, "status", "text")?,
                created_at: micros(named::<i64>(r, 3, "created_at", "an integer")?, "created_at")?,
                updated_at: micros(named::<i64>(r, 4, "updated_at", "an integer")?, "updated_at")?,
                last_seq: u64::try_from(last_seq)
                    .map_err(|_| format!("column `last_seq` holds {last_seq}, not a count"))?,
                parent_run_id: named(r, 7, "parent_run_id", "text or null")?,
                root_run_id: named(r, 8, "root_run_id", "text or null")?,
                tenant: named(r, 10, "tenant", "text or null")?,
                idempotency: crate::stored::key_claim(
                    named(r, 9, "idempotency_key", "text or null")?,
                    named(r, 11, "key_request", "text or null")?,
                    named(r, 12, "key_expires_us", "an integer or null")?,
                )?,
                placement: Placement {
                    queue: named(r, 13, "queue", "text")?,
                    priority: named(r, 14, "priority", "a small integer")?,
                    due_at: named::<Option<i64>>(r, 15, "due_us", "an integer or null")?
                        .map(|us| micros(us, "due_us"))
                        .transpose()?,
                    home: named(r, 16, "home", "text or null")?,
                },
            },
            head.as_deref().and_then(chain::from_bytes),
        ))
    };
    Ok(read().map_err(fail))
}

/// A time column of `runs` (microseconds since the Unix epoch).
fn micros(us: i64, column: &str) -> Result<DateTime<Utc>, String> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| format!("column `{column}` holds {us}, not a time"))
}

pub(crate) const RUN_COLUMNS: &str = "run_id, scenario_id, status, created_at, updated_at, last_seq, head_hash, parent_run_id, root_run_id, idempotency_key, tenant, key_request, key_expires_us, queue, priority, due_us, home";

/// A run as a load reads it: its record, its head hash, its integer key and its chain's
/// form.
pub(crate) type RunForLoad = (RunRecord, Option<Hash>, i64, chain::Form);

/// A run's record, its head hash, its integer key and its chain's form, for a load.
pub(crate) fn run_for_load(conn: &Connection, run_id: &str) -> Result<Option<RunForLoad>, Error> {
    cached_row(
        conn,
        &format!("SELECT {RUN_COLUMNS}, rk, chain FROM runs WHERE run_id = ?1"),
        [run_id],
        |r| {
            const AFTER: usize = crate::stored::column_count(RUN_COLUMNS);
            let rk = r.get::<_, i64>(AFTER).unwrap_or(0);
            let form = r.get::<_, i64>(AFTER + 1).unwrap_or(0);
            Ok(to_record(r)?.and_then(|(record, head)| {
                let form = chain::Form::from_number(form)
                    .ok_or_else(|| chain::Form::unknown(run_id, form))?;
                Ok((record, head, rk, form))
            }))
        },
    )
    .optional()
    .map_err(backend)?
    .transpose()
}
