//! Queues and tenant limits on PostgreSQL (see [`crate::queues`]).

use baton_engine::model::BoxFuture;
use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::common::{NOW_US, micros, pg};
use super::{HOLDER_ALIVE, PostgresStore};
use crate::queues::{
    QUEUES_MAX, QueueChange, QueueLoad, QueueRecord, QueueSet, QueueStore, TenantLimit,
};

const COLUMNS: &str = "name, aging_s, max_running, created_us, updated_us";

fn time(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

fn queue_of(r: &Row) -> Result<QueueRecord, Error> {
    Ok(QueueRecord {
        name: r.try_get(0).map_err(pg)?,
        aging_s: u64::try_from(r.try_get::<_, i64>(1).map_err(pg)?).unwrap_or_default(),
        max_running: r
            .try_get::<_, Option<i32>>(2)
            .map_err(pg)?
            .and_then(|n| u32::try_from(n).ok()),
        created_at: time(r.try_get(3).map_err(pg)?),
        updated_at: time(r.try_get(4).map_err(pg)?),
    })
}

fn limit_param(n: Option<u32>) -> Option<i32> {
    n.map(|n| i32::try_from(n).unwrap_or(i32::MAX))
}

impl QueueStore for PostgresStore {
    fn create_queue<'a>(&'a self, q: &'a QueueRecord) -> BoxFuture<'a, Result<QueueChange, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let aging = i64::try_from(q.aging_s).unwrap_or(i64::MAX);
            let limit = limit_param(q.max_running);
            // The count and the insert in one statement; two creates of one name are told
            // apart by the key (the second inserts nothing).
            let full = i64::try_from(QUEUES_MAX).unwrap_or(i64::MAX);
            let n = c
                .execute(
                    &format!(
                        "INSERT INTO queues ({COLUMNS}) SELECT $1, $2, $3, $4, $4
                          WHERE (SELECT count(*) FROM queues) < $5
                         ON CONFLICT (name) DO NOTHING"
                    ),
                    &[&q.name, &aging, &limit, &micros(q.created_at), &full],
                )
                .await
                .map_err(pg)?;
            if n == 1 {
                return Ok(QueueChange::Created);
            }
            Ok(if self.queue(&q.name).await?.is_some() {
                QueueChange::Exists
            } else {
                QueueChange::Full
            })
        })
    }

    fn change_queue<'a>(
        &'a self,
        name: &'a str,
        set: QueueSet,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<QueueRecord>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let aging = set.aging_s.map(|a| i64::try_from(a).unwrap_or(i64::MAX));
            let limit = limit_param(set.max_running.flatten());
            let rows = c
                .query(
                    &format!(
                        "UPDATE queues SET aging_s = COALESCE($2, aging_s),
                                max_running = CASE WHEN $3 THEN $4 ELSE max_running END,
                                updated_us = $5
                          WHERE name = $1 RETURNING {COLUMNS}"
                    ),
                    &[&name, &aging, &set.max_running.is_some(), &limit, &micros(at)],
                )
                .await
                .map_err(pg)?;
            rows.first().map(queue_of).transpose()
        })
    }

    fn queue<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<QueueRecord>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = c
                .query(&format!("SELECT {COLUMNS} FROM queues WHERE name = $1"), &[&name])
                .await
                .map_err(pg)?;
            rows.first().map(queue_of).transpose()
        })
    }

    /// Waiting: running, not leased now, and the job's root held by no live process.
    fn queue_loads(&self, now: DateTime<Utc>) -> BoxFuture<'_, Result<Vec<QueueLoad>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!(
                        "SELECT {COLUMNS},
                           (SELECT count(*) FROM runs x JOIN runs j ON j.run_id = COALESCE(x.root_run_id, x.run_id)
                             WHERE x.status = 'running' AND x.lease_owner IS NOT NULL
                               AND x.lease_until_us >= $1 AND j.queue = q.name),
                           (SELECT count(*) FROM runs x JOIN runs j ON j.run_id = COALESCE(x.root_run_id, x.run_id)
                             WHERE x.status = 'running' AND j.queue = q.name
                               AND (x.lease_until_us IS NULL OR x.lease_until_us < $1)
                               AND NOT EXISTS (SELECT 1 FROM holds h
                                    WHERE h.run_id = j.run_id AND h.until_us >= {NOW_US} AND {HOLDER_ALIVE}))
                         FROM queues q ORDER BY name"
                    ),
                    &[&micros(now)],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    let leased: i64 = r.try_get(5).map_err(pg)?;
                    let waiting: i64 = r.try_get(6).map_err(pg)?;
                    Ok(QueueLoad {
                        queue: queue_of(r)?,
                        waiting: u64::try_from(waiting).unwrap_or_default(),
                        leased: u64::try_from(leased).unwrap_or_default(),
                    })
                })
                .collect()
        })
    }

    fn set_tenant_limit<'a>(
        &'a self,
        tenant: &'a str,
        max_running: Option<u32>,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let n = match limit_param(max_running) {
                Some(max) => c
                    .execute(
                        "INSERT INTO tenant_limits (tenant, max_running, updated_us) VALUES ($1, $2, $3)
                         ON CONFLICT (tenant) DO UPDATE SET max_running = excluded.max_running, updated_us = excluded.updated_us",
                        &[&tenant, &max, &micros(at)],
                    )
                    .await,
                None => c.execute("DELETE FROM tenant_limits WHERE tenant = $1", &[&tenant]).await,
            }
            .map_err(pg)?;
            Ok(n > 0)
        })
    }

    fn tenant_limits(&self) -> BoxFuture<'_, Result<Vec<TenantLimit>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = c
                .query(
                    "SELECT tenant, max_running, updated_us FROM tenant_limits ORDER BY tenant",
                    &[],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    Ok(TenantLimit {
                        tenant: r.try_get(0).map_err(pg)?,
                        max_running: u32::try_from(r.try_get::<_, i32>(1).map_err(pg)?)
                            .unwrap_or_default(),
                        updated_at: time(r.try_get(2).map_err(pg)?),
                    })
                })
                .collect()
        })
    }
}
