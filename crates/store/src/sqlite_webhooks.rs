//! Webhooks in the SQLite store: the webhooks, the outbox written inside each append's
//! transaction ([`enqueue`], called by the log's batch writer), and the leases, attempts
//! and listings the senders use. Times are integer microseconds.

use baton_engine::event::Event;
use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};
use tokio::sync::oneshot;

use crate::sqlite_rows::backend;
use crate::webhooks::{
    AfterAttempt, Attempt, Claimed, Delivery, DeliveryLog, DeliveryState, WebhookRecord,
};
use crate::webhooks::{DELIVERY_COLUMNS, WEBHOOK_COLUMNS as COLUMNS};

type Reply<T> = oneshot::Sender<Result<T, Error>>;

/// A webhook request, served by the writer thread (changes) or a reader (reads).
pub(crate) enum WebhookOp {
    Put(Box<WebhookRecord>, usize, Reply<bool>),
    Get(String, Reply<Option<WebhookRecord>>),
    List(Reply<Vec<WebhookRecord>>),
    Remove(String, DateTime<Utc>, Reply<bool>),
    Rotate(String, String, DateTime<Utc>, Reply<bool>),
    Claim {
        owner: String,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
        reply: Reply<Vec<Claimed>>,
    },
    Record(String, Box<Attempt>, AfterAttempt, Reply<bool>),
    Deliveries(String, usize, Reply<Vec<DeliveryLog>>),
}

fn at(us: Option<i64>) -> Option<DateTime<Utc>> {
    us.and_then(DateTime::from_timestamp_micros)
}

fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn webhook_of(r: &Row<'_>) -> rusqlite::Result<WebhookRecord> {
    let types: String = r.get(3)?;
    Ok(WebhookRecord {
        id: r.get(0)?,
        tenant: r.get(1)?,
        url: r.get(2)?,
        types: types.split(',').filter(|t| !t.is_empty()).map(str::to_owned).collect(),
        secret: r.get(4)?,
        previous_secret: r.get(5)?,
        previous_until: at(r.get(6)?),
        created_at: at(Some(r.get(7)?)).unwrap_or_default(),
        removed_at: at(r.get(8)?),
    })
}

fn delivery_of(r: &Row<'_>) -> rusqlite::Result<Delivery> {
    let state: String = r.get(9)?;
    Ok(Delivery {
        id: r.get(0)?,
        webhook_id: r.get(1)?,
        run_id: r.get(2)?,
        seq: r.get::<_, i64>(3)?.try_into().unwrap_or_default(),
        kind: r.get(4)?,
        body: r.get(5)?,
        created_at: at(Some(r.get(6)?)).unwrap_or_default(),
        next_at: at(Some(r.get(7)?)).unwrap_or_default(),
        attempts: r.get::<_, i64>(8)?.try_into().unwrap_or_default(),
        state: DeliveryState::parse(&state).unwrap_or(DeliveryState::Failed),
        last_error: r.get(10)?,
    })
}

/// Writes the deliveries `events` (just appended to run `rk`) cause, in the open
/// transaction: one per event of a webhook type and live webhook of the run's tenant that
/// is sent that type.
pub(crate) fn enqueue(conn: &Connection, rk: i64, events: &[Event]) -> Result<(), Error> {
    if !crate::webhooks::causes_deliveries(events) {
        return Ok(());
    }
    // The run, and whether its tenant has a webhook at all: without one, no delivery is
    // made, and no body is written (read in the append's transaction, so a webhook added
    // by another process is seen by the first append that commits after it).
    let (run_id, tenant, hooked): (String, Option<String>, bool) = conn
        .prepare_cached(
            "SELECT r.run_id, r.tenant, EXISTS (SELECT 1 FROM webhooks w WHERE w.tenant IS r.tenant AND w.removed_us IS NULL)
             FROM runs r WHERE r.rk = ?1",
        )
        .and_then(|mut s| s.query_row([rk], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))
        .map_err(backend)?;
    if !hooked {
        return Ok(());
    }
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO webhook_deliveries (id, webhook_id, run_id, seq, type, body, created_us, next_us)
             SELECT 'msg_' || w.id || '_' || ?1 || '_' || ?2, w.id, ?1, ?2, ?3, ?4, ?5, ?5
             FROM webhooks w
             WHERE w.tenant IS ?6 AND w.removed_us IS NULL
               AND instr(',' || w.types || ',', ',' || ?3 || ',') > 0
             ON CONFLICT (id) DO NOTHING",
        )
        .map_err(backend)?;
    for (event, kind, body) in crate::webhooks::outbox(&run_id, tenant.as_deref(), events) {
        let seq = i64::try_from(event.seq).unwrap_or(i64::MAX);
        insert.execute(params![run_id, seq, kind, body, us(event.at), tenant]).map_err(backend)?;
    }
    Ok(())
}

/// Serves one webhook request.
pub(crate) fn webhook_op(conn: &Connection, op: WebhookOp) {
    match op {
        WebhookOp::Put(w, per_tenant, reply) => {
            let put = conn
                .execute(
                    &format!(
                        "INSERT INTO webhooks ({COLUMNS})
                         SELECT ?1, ?2, ?3, ?4, ?5, NULL, NULL, ?6, NULL
                         WHERE (SELECT count(*) FROM webhooks WHERE tenant IS ?2 AND removed_us IS NULL) < ?7"
                    ),
                    params![
                        w.id,
                        w.tenant,
                        w.url,
                        w.types.join(","),
                        w.secret,
                        us(w.created_at),
                        i64::try_from(per_tenant).unwrap_or(i64::MAX)
                    ],
                )
                .map(|n| n == 1)
                .map_err(backend);
            let _ = reply.send(put);
        }
        WebhookOp::Get(id, reply) => {
            let found = conn
                .query_row(&format!("SELECT {COLUMNS} FROM webhooks WHERE id = ?1"), [id], |r| {
                    webhook_of(r)
                })
                .optional()
                .map_err(backend);
            let _ = reply.send(found);
        }
        WebhookOp::List(reply) => {
            let _ = reply.send(list(conn));
        }
        WebhookOp::Remove(id, when, reply) => {
            let _ = reply.send(remove(conn, &id, when));
        }
        WebhookOp::Rotate(id, secret, until, reply) => {
            let rotated = conn
                .execute(
                    "UPDATE webhooks SET previous_secret = secret, previous_until_us = ?3, secret = ?2
                     WHERE id = ?1 AND removed_us IS NULL",
                    params![id, secret, us(until)],
                )
                .map(|n| n == 1)
                .map_err(backend);
            let _ = reply.send(rotated);
        }
        WebhookOp::Claim { owner, now, until, max, reply } => {
            let _ = reply.send(claim(conn, &owner, now, until, max));
        }
        WebhookOp::Record(owner, attempt, after, reply) => {
            let _ = reply.send(record(conn, &owner, &attempt, &after));
        }
        WebhookOp::Deliveries(webhook_id, limit, reply) => {
            let _ = reply.send(deliveries(conn, &webhook_id, limit));
        }
    }
}

fn list(conn: &Connection) -> Result<Vec<WebhookRecord>, Error> {
    let mut s = conn
        .prepare(&format!(
            "SELECT {COLUMNS} FROM webhooks WHERE removed_us IS NULL ORDER BY created_us, id"
        ))
        .map_err(backend)?;
    let rows = s.query_map([], webhook_of).map_err(backend)?;
    rows.collect::<Result<_, _>>().map_err(backend)
}

fn remove(conn: &Connection, id: &str, when: DateTime<Utc>) -> Result<bool, Error> {
    let tx = conn.unchecked_transaction().map_err(backend)?;
    let removed = tx
        .execute(
            "UPDATE webhooks SET removed_us = ?2 WHERE id = ?1 AND removed_us IS NULL",
            params![id, us(when)],
        )
        .map_err(backend)?;
    tx.execute(
        "UPDATE webhook_deliveries SET state = 'failed', last_error = 'the webhook was removed'
         WHERE webhook_id = ?1 AND state = 'pending'",
        [id],
    )
    .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(removed == 1)
}

fn claim(
    conn: &Connection,
    owner: &str,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
    max: usize,
) -> Result<Vec<Claimed>, Error> {
    let tx = conn.unchecked_transaction().map_err(backend)?;
    let ids: Vec<String> = {
        let mut s = tx
            .prepare_cached(
                "SELECT id FROM webhook_deliveries
                 WHERE state = 'pending' AND next_us <= ?1 AND (lease_until_us IS NULL OR lease_until_us < ?1)
                 ORDER BY next_us, id LIMIT ?2",
            )
            .map_err(backend)?;
        let rows = s
            .query_map(params![us(now), i64::try_from(max).unwrap_or(i64::MAX)], |r| r.get(0))
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)?
    };
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        tx.execute(
            "UPDATE webhook_deliveries SET lease_owner = ?2, lease_until_us = ?3 WHERE id = ?1",
            params![id, owner, us(until)],
        )
        .map_err(backend)?;
        let delivery = tx
            .query_row(
                &format!("SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE id = ?1"),
                [&id],
                delivery_of,
            )
            .map_err(backend)?;
        let webhook = tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM webhooks WHERE id = ?1"),
                [&delivery.webhook_id],
                webhook_of,
            )
            .map_err(backend)?;
        out.push(Claimed { delivery, webhook });
    }
    tx.commit().map_err(backend)?;
    Ok(out)
}

fn record(
    conn: &Connection,
    owner: &str,
    attempt: &Attempt,
    after: &AfterAttempt,
) -> Result<bool, Error> {
    let tx = conn.unchecked_transaction().map_err(backend)?;
    let (state, next, error): (&str, Option<i64>, Option<String>) = match after {
        AfterAttempt::Delivered => ("delivered", None, None),
        AfterAttempt::RetryAt(t) => ("pending", Some(us(*t)), attempt.error.clone()),
        AfterAttempt::GiveUp(why) => ("failed", None, Some(why.clone())),
    };
    let updated = tx
        .execute(
            "UPDATE webhook_deliveries
             SET state = ?3, next_us = coalesce(?4, next_us), attempts = ?5, last_error = ?6,
                 lease_owner = NULL, lease_until_us = NULL
             WHERE id = ?1 AND lease_owner = ?2 AND state = 'pending'",
            params![
                attempt.delivery_id,
                owner,
                state,
                next,
                i64::from(attempt.attempt),
                error.or_else(|| attempt.error.clone())
            ],
        )
        .map_err(backend)?;
    if updated == 0 {
        return Ok(false);
    }
    tx.execute(
        "INSERT INTO webhook_attempts (delivery_id, attempt, at_us, status, error, duration_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        params![
            attempt.delivery_id,
            i64::from(attempt.attempt),
            us(attempt.at),
            attempt.status.map(i64::from),
            attempt.error,
            i64::try_from(attempt.duration_ms).unwrap_or(i64::MAX)
        ],
    )
    .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(true)
}

fn deliveries(
    conn: &Connection,
    webhook_id: &str,
    limit: usize,
) -> Result<Vec<DeliveryLog>, Error> {
    let found: Vec<Delivery> = {
        let mut s = conn
            .prepare(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = ?1
                 ORDER BY created_us DESC, id DESC LIMIT ?2"
            ))
            .map_err(backend)?;
        let rows = s
            .query_map(params![webhook_id, i64::try_from(limit).unwrap_or(i64::MAX)], delivery_of)
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)?
    };
    let mut s = conn
        .prepare(
            "SELECT attempt, at_us, status, error, duration_ms FROM webhook_attempts
             WHERE delivery_id = ?1 ORDER BY attempt",
        )
        .map_err(backend)?;
    let mut out = Vec::with_capacity(found.len());
    for d in found {
        let rows = s
            .query_map([&d.id], |r| {
                Ok(Attempt {
                    delivery_id: d.id.clone(),
                    attempt: r.get::<_, i64>(0)?.try_into().unwrap_or_default(),
                    at: at(Some(r.get(1)?)).unwrap_or_default(),
                    status: r.get::<_, Option<i64>>(2)?.and_then(|s| u16::try_from(s).ok()),
                    error: r.get(3)?,
                    duration_ms: r.get::<_, i64>(4)?.try_into().unwrap_or_default(),
                })
            })
            .map_err(backend)?;
        let attempts = rows.collect::<Result<_, _>>().map_err(backend)?;
        out.push((d, attempts));
    }
    Ok(out)
}
