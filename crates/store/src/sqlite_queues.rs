//! Queues and tenant limits in the SQLite store (see [`crate::queues`]): changes made by
//! the writer thread, reads by a reader. Times are integer microseconds.

use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};
use tokio::sync::oneshot;

use crate::queues::{QUEUES_MAX, QueueChange, QueueRecord, QueueSet, TenantLimit};
use crate::sqlite_rows::backend;

type Reply<T> = oneshot::Sender<Result<T, Error>>;

/// At most this many waiting runs of one queue are looked at for their holds; past it the
/// queue is reported this deep.
pub(crate) const WAITING_LOOKED_AT_MAX: usize = 10_000;

/// A queue and the runs of it: how many are leased, and the waiting ones' jobs (whose
/// holds, lock files, the store checks after).
pub(crate) type QueueRows = Vec<(QueueRecord, u64, Vec<String>)>;

/// A queue or limit request, served by the writer thread (changes) or a reader (reads).
pub(crate) enum QueueOp {
    Create(Box<QueueRecord>, Reply<QueueChange>),
    Change(String, QueueSet, DateTime<Utc>, Reply<Option<QueueRecord>>),
    Get(String, Reply<Option<QueueRecord>>),
    Loads(DateTime<Utc>, Reply<QueueRows>),
    SetLimit(String, Option<u32>, DateTime<Utc>, Reply<bool>),
    Limits(Reply<Vec<TenantLimit>>),
}

fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn time(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

const COLUMNS: &str = "name, aging_s, max_running, created_us, updated_us";

fn to_queue(r: &Row<'_>) -> rusqlite::Result<QueueRecord> {
    Ok(QueueRecord {
        name: r.get(0)?,
        aging_s: u64::try_from(r.get::<_, i64>(1)?).unwrap_or_default(),
        max_running: r.get::<_, Option<i64>>(2)?.and_then(|n| u32::try_from(n).ok()),
        created_at: time(r.get(3)?),
        updated_at: time(r.get(4)?),
    })
}

/// Sets what `set` gives of queue `name`, in one statement.
fn change(
    conn: &Connection,
    name: &str,
    set: QueueSet,
    at: DateTime<Utc>,
) -> rusqlite::Result<Option<QueueRecord>> {
    let aging = set.aging_s.map(|a| i64::try_from(a).unwrap_or(i64::MAX));
    let limit = set.max_running.flatten().map(i64::from);
    conn.query_row(
        &format!(
            "UPDATE queues SET aging_s = COALESCE(?2, aging_s),
                    max_running = CASE WHEN ?3 THEN ?4 ELSE max_running END, updated_us = ?5
              WHERE name = ?1 RETURNING {COLUMNS}"
        ),
        params![name, aging, set.max_running.is_some(), limit, us(at)],
        to_queue,
    )
    .optional()
}

fn create(conn: &Connection, q: &QueueRecord) -> rusqlite::Result<QueueChange> {
    let aging = i64::try_from(q.aging_s).unwrap_or(i64::MAX);
    let limit = q.max_running.map(i64::from);
    // As on PostgreSQL: the count and the insert in one statement, a second create of one
    // name (from any process) told apart by the key.
    let n = conn.execute(
        &format!(
            "INSERT INTO queues ({COLUMNS}) SELECT ?1, ?2, ?3, ?4, ?4
              WHERE (SELECT count(*) FROM queues) < ?5
             ON CONFLICT (name) DO NOTHING"
        ),
        params![q.name, aging, limit, us(q.created_at), QUEUES_MAX as i64],
    )?;
    if n == 1 {
        return Ok(QueueChange::Created);
    }
    let exists =
        conn.query_row("SELECT 1 FROM queues WHERE name = ?1", [&q.name], |_| Ok(())).optional()?;
    Ok(if exists.is_some() { QueueChange::Exists } else { QueueChange::Full })
}

/// Every queue with its leased runs, and the jobs of its runs that wait (running, not
/// leased now), at most [`WAITING_LOOKED_AT_MAX`] of them.
fn loads(conn: &Connection, now: DateTime<Utc>) -> rusqlite::Result<QueueRows> {
    let queues: Vec<QueueRecord> = conn
        .prepare(&format!("SELECT {COLUMNS} FROM queues ORDER BY name"))?
        .query_map([], to_queue)?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::with_capacity(queues.len());
    for q in queues {
        let leased: i64 = conn.query_row(
            "SELECT count(*) FROM runs x JOIN runs j ON j.run_id = COALESCE(x.root_run_id, x.run_id)
              WHERE x.status = 'running' AND x.lease_owner IS NOT NULL AND x.lease_until_us >= ?2
                AND j.queue = ?1",
            params![q.name, us(now)],
            |r| r.get(0),
        )?;
        let waiting: Vec<String> = conn
            .prepare(
                "SELECT j.run_id FROM runs x JOIN runs j ON j.run_id = COALESCE(x.root_run_id, x.run_id)
                  WHERE x.status = 'running' AND (x.lease_until_us IS NULL OR x.lease_until_us < ?2)
                    AND j.queue = ?1
                  LIMIT ?3",
            )?
            .query_map(params![q.name, us(now), WAITING_LOOKED_AT_MAX as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        out.push((q, u64::try_from(leased).unwrap_or_default(), waiting));
    }
    Ok(out)
}

fn set_limit(
    conn: &Connection,
    tenant: &str,
    max: Option<u32>,
    at: DateTime<Utc>,
) -> rusqlite::Result<bool> {
    let n = match max {
        Some(max) => conn.execute(
            "INSERT INTO tenant_limits (tenant, max_running, updated_us) VALUES (?1, ?2, ?3)
             ON CONFLICT (tenant) DO UPDATE SET max_running = excluded.max_running, updated_us = excluded.updated_us",
            params![tenant, i64::from(max), us(at)],
        )?,
        None => conn.execute("DELETE FROM tenant_limits WHERE tenant = ?1", [tenant])?,
    };
    Ok(n > 0)
}

fn limits(conn: &Connection) -> rusqlite::Result<Vec<TenantLimit>> {
    conn.prepare("SELECT tenant, max_running, updated_us FROM tenant_limits ORDER BY tenant")?
        .query_map([], |r| {
            Ok(TenantLimit {
                tenant: r.get(0)?,
                max_running: u32::try_from(r.get::<_, i64>(1)?).unwrap_or(u32::MAX),
                updated_at: time(r.get(2)?),
            })
        })?
        .collect()
}

pub(crate) fn queue_op(conn: &Connection, op: QueueOp) {
    match op {
        QueueOp::Create(q, reply) => {
            let _ = reply.send(create(conn, &q).map_err(backend));
        }
        QueueOp::Change(name, set, at, reply) => {
            let _ = reply.send(change(conn, &name, set, at).map_err(backend));
        }
        QueueOp::Get(name, reply) => {
            let got = conn
                .query_row(
                    &format!("SELECT {COLUMNS} FROM queues WHERE name = ?1"),
                    [&name],
                    to_queue,
                )
                .optional()
                .map_err(backend);
            let _ = reply.send(got);
        }
        QueueOp::Loads(now, reply) => {
            let _ = reply.send(loads(conn, now).map_err(backend));
        }
        QueueOp::SetLimit(tenant, max, at, reply) => {
            let _ = reply.send(set_limit(conn, &tenant, max, at).map_err(backend));
        }
        QueueOp::Limits(reply) => {
            let _ = reply.send(limits(conn).map_err(backend));
        }
    }
}
