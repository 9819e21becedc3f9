//! Webhooks on PostgreSQL: the webhooks, the leases, attempts and listings of their
//! deliveries. The outbox itself is written by the `events_webhook_outbox` trigger
//! (migration 0005), inside whatever statement inserts the events.

use baton_engine::model::BoxFuture;
use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::PostgresStore;
use super::common::{micros, pg};
use crate::webhooks::{
    AfterAttempt, Attempt, Claimed, Delivery, DeliveryLog, DeliveryState, WebhookRecord,
    WebhookStore,
};
use crate::webhooks::{DELIVERY_COLUMNS, WEBHOOK_COLUMNS as COLUMNS};

fn at(us: Option<i64>) -> Option<DateTime<Utc>> {
    us.and_then(DateTime::from_timestamp_micros)
}

fn webhook_of(r: &Row) -> Result<WebhookRecord, Error> {
    webhook_from(r, 0)
}

/// A webhook from the row's columns [`COLUMNS`], the first at `first`.
fn webhook_from(r: &Row, first: usize) -> Result<WebhookRecord, Error> {
    let c = |i: usize| first + i;
    let types: String = r.try_get(c(3)).map_err(pg)?;
    Ok(WebhookRecord {
        id: r.try_get(c(0)).map_err(pg)?,
        tenant: r.try_get(c(1)).map_err(pg)?,
        url: r.try_get(c(2)).map_err(pg)?,
        types: types.split(',').filter(|t| !t.is_empty()).map(str::to_owned).collect(),
        secret: r.try_get(c(4)).map_err(pg)?,
        previous_secret: r.try_get(c(5)).map_err(pg)?,
        previous_until: at(r.try_get(c(6)).map_err(pg)?),
        created_at: at(Some(r.try_get(c(7)).map_err(pg)?)).unwrap_or_default(),
        removed_at: at(r.try_get(c(8)).map_err(pg)?),
    })
}

fn delivery_of(r: &Row) -> Result<Delivery, Error> {
    let state: String = r.try_get(9).map_err(pg)?;
    Ok(Delivery {
        id: r.try_get(0).map_err(pg)?,
        webhook_id: r.try_get(1).map_err(pg)?,
        run_id: r.try_get(2).map_err(pg)?,
        seq: r.try_get::<_, i64>(3).map_err(pg)?.try_into().unwrap_or_default(),
        kind: r.try_get(4).map_err(pg)?,
        body: r.try_get(5).map_err(pg)?,
        created_at: at(Some(r.try_get(6).map_err(pg)?)).unwrap_or_default(),
        next_at: at(Some(r.try_get(7).map_err(pg)?)).unwrap_or_default(),
        attempts: r.try_get::<_, i64>(8).map_err(pg)?.try_into().unwrap_or_default(),
        state: DeliveryState::parse(&state).unwrap_or(DeliveryState::Failed),
        last_error: r.try_get(10).map_err(pg)?,
    })
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl WebhookStore for PostgresStore {
    fn put_webhook<'a>(
        &'a self,
        w: &'a WebhookRecord,
        per_tenant: usize,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg)?;
            // One tenant's adds wait for each other, so the cap counts them all.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext('baton webhooks ' || coalesce($1, '')))",
                &[&w.tenant],
            )
            .await
            .map_err(pg)?;
            let n = tx
                .execute(
                    &format!(
                        "INSERT INTO webhooks ({COLUMNS})
                         SELECT $1, $2, $3, $4, $5, NULL, NULL, $6, NULL
                          WHERE (SELECT count(*) FROM webhooks
                                  WHERE tenant IS NOT DISTINCT FROM $2 AND removed_us IS NULL) < $7"
                    ),
                    &[
                        &w.id,
                        &w.tenant,
                        &w.url,
                        &w.types.join(","),
                        &w.secret,
                        &micros(w.created_at),
                        &count(per_tenant),
                    ],
                )
                .await
                .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            Ok(n == 1)
        })
    }

    fn webhook<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<WebhookRecord>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = c
                .query(&format!("SELECT {COLUMNS} FROM webhooks WHERE id = $1"), &[&id])
                .await
                .map_err(pg)?;
            rows.first().map(webhook_of).transpose()
        })
    }

    fn webhooks(&self) -> BoxFuture<'_, Result<Vec<WebhookRecord>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM webhooks WHERE removed_us IS NULL ORDER BY created_us, id"
                    ),
                    &[],
                )
                .await
                .map_err(pg)?;
            rows.iter().map(webhook_of).collect()
        })
    }

    fn remove_webhook<'a>(
        &'a self,
        id: &'a str,
        when: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg)?;
            let n = tx
                .execute(
                    "UPDATE webhooks SET removed_us = $2 WHERE id = $1 AND removed_us IS NULL",
                    &[&id, &micros(when)],
                )
                .await
                .map_err(pg)?;
            tx.execute(
                "UPDATE webhook_deliveries SET state = 'failed', last_error = 'the webhook was removed'
                  WHERE webhook_id = $1 AND state = 'pending'",
                &[&id],
            )
            .await
            .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            Ok(n == 1)
        })
    }

    fn rotate_webhook<'a>(
        &'a self,
        id: &'a str,
        secret: &'a str,
        previous_until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let n = c
                .execute(
                    "UPDATE webhooks SET previous_secret = secret, previous_until_us = $3, secret = $2
                      WHERE id = $1 AND removed_us IS NULL",
                    &[&id, &secret, &micros(previous_until)],
                )
                .await
                .map_err(pg)?;
            Ok(n == 1)
        })
    }

    fn claim_deliveries<'a>(
        &'a self,
        owner: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<Claimed>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let columns = DELIVERY_COLUMNS
                .split(", ")
                .map(|c| format!("d.{c}"))
                .collect::<Vec<_>>()
                .join(", ");
            let webhook_columns =
                COLUMNS.split(", ").map(|c| format!("w.{c}")).collect::<Vec<_>>().join(", ");
            let rows = c
                .query(
                    &format!(
                        "WITH due AS (
                           SELECT id FROM webhook_deliveries
                            WHERE state = 'pending' AND next_us <= $1
                              AND (lease_until_us IS NULL OR lease_until_us < $1)
                            ORDER BY next_us, id LIMIT $2 FOR UPDATE SKIP LOCKED
                         ), leased AS (
                           UPDATE webhook_deliveries d SET lease_owner = $3, lease_until_us = $4
                             FROM due WHERE d.id = due.id RETURNING d.*
                         )
                         SELECT {columns}, {webhook_columns}
                           FROM leased d JOIN webhooks w ON w.id = d.webhook_id
                          ORDER BY d.next_us, d.id"
                    ),
                    &[&micros(now), &count(max), &owner, &micros(until)],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    // The delivery's columns, then the webhook's.
                    let delivery = delivery_of(r)?;
                    let webhook = webhook_from(r, DELIVERY_COLUMNS.split(", ").count())?;
                    Ok(Claimed { delivery, webhook })
                })
                .collect()
        })
    }

    fn record_attempt<'a>(
        &'a self,
        owner: &'a str,
        attempt: &'a Attempt,
        after: &'a AfterAttempt,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let (state, next, error): (&str, Option<i64>, Option<String>) = match after {
                AfterAttempt::Delivered => ("delivered", None, None),
                AfterAttempt::RetryAt(t) => ("pending", Some(micros(*t)), attempt.error.clone()),
                AfterAttempt::GiveUp(why) => ("failed", None, Some(why.clone())),
            };
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg)?;
            let n = tx
                .execute(
                    "UPDATE webhook_deliveries
                        SET state = $3, next_us = coalesce($4, next_us), attempts = $5,
                            last_error = $6, lease_owner = NULL, lease_until_us = NULL
                      WHERE id = $1 AND lease_owner = $2 AND state = 'pending'",
                    &[
                        &attempt.delivery_id,
                        &owner,
                        &state,
                        &next,
                        &i64::from(attempt.attempt),
                        &error.or_else(|| attempt.error.clone()),
                    ],
                )
                .await
                .map_err(pg)?;
            if n == 0 {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO webhook_attempts (delivery_id, attempt, at_us, status, error, duration_ms)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                &[
                    &attempt.delivery_id,
                    &i64::from(attempt.attempt),
                    &micros(attempt.at),
                    &attempt.status.map(i64::from),
                    &attempt.error,
                    &i64::try_from(attempt.duration_ms).unwrap_or(i64::MAX),
                ],
            )
            .await
            .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            Ok(true)
        })
    }

    fn deliveries<'a>(
        &'a self,
        webhook_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryLog>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!(
                        "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE webhook_id = $1
                          ORDER BY created_us DESC, id DESC LIMIT $2"
                    ),
                    &[&webhook_id, &count(limit)],
                )
                .await
                .map_err(pg)?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let d = delivery_of(r)?;
                let tries = c
                    .query(
                        "SELECT attempt, at_us, status, error, duration_ms FROM webhook_attempts
                          WHERE delivery_id = $1 ORDER BY attempt",
                        &[&d.id],
                    )
                    .await
                    .map_err(pg)?;
                let attempts = tries
                    .iter()
                    .map(|t| {
                        Ok(Attempt {
                            delivery_id: d.id.clone(),
                            attempt: t.try_get::<_, i64>(0).map_err(pg)?.try_into().unwrap_or(0),
                            at: at(Some(t.try_get(1).map_err(pg)?)).unwrap_or_default(),
                            status: t
                                .try_get::<_, Option<i64>>(2)
                                .map_err(pg)?
                                .and_then(|s| u16::try_from(s).ok()),
                            error: t.try_get(3).map_err(pg)?,
                            duration_ms: t
                                .try_get::<_, i64>(4)
                                .map_err(pg)?
                                .try_into()
                                .unwrap_or(0),
                        })
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                out.push((d, attempts));
            }
            Ok(out)
        })
    }
}
