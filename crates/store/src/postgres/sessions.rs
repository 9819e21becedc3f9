//! The browser sessions' statements on PostgreSQL (the `sessions` table): keep one (with
//! the cap per token and the forgetting of old ones, in one transaction), find one by hash,
//! touch and revoke one.

use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::common::{micros, pg};
use crate::tokens::SessionRecord;

const COLUMNS: &str = "sha256, token_sha256, token_id, created_us, seen_us, revoked_us";

fn at(us: i64, column: &str) -> Result<DateTime<Utc>, Error> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| Error::Backend(format!("sessions.{column} holds no time: {us}")))
}

fn to_session(r: &Row) -> Result<SessionRecord, Error> {
    let revoked: Option<i64> = r.try_get(5).map_err(pg)?;
    Ok(SessionRecord {
        sha256: r.try_get(0).map_err(pg)?,
        token_sha256: r.try_get(1).map_err(pg)?,
        token_id: r.try_get(2).map_err(pg)?,
        created_at: at(r.try_get(3).map_err(pg)?, "created_us")?,
        seen_at: at(r.try_get(4).map_err(pg)?, "seen_us")?,
        revoked_at: revoked.map(|us| at(us, "revoked_us")).transpose()?,
    })
}

/// Keeps `s`, forgets sessions made before `forget_before` and revokes the oldest live ones
/// of its token past `per_token`; returns the hashes revoked, oldest first.
pub(super) async fn put(
    c: &mut deadpool_postgres::Object,
    s: &SessionRecord,
    per_token: usize,
    forget_before: DateTime<Utc>,
) -> Result<Vec<String>, Error> {
    let tx = c.transaction().await.map_err(pg)?;
    tx.execute("DELETE FROM sessions WHERE created_us < $1", &[&micros(forget_before)])
        .await
        .map_err(pg)?;
    tx.execute(
        &format!("INSERT INTO sessions ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, NULL)"),
        &[&s.sha256, &s.token_sha256, &s.token_id, &micros(s.created_at), &micros(s.seen_at)],
    )
    .await
    .map_err(|e| {
        Error::Backend(format!("cannot keep a session: {}", super::common::db_error(&e)))
    })?;
    // The token's row is locked first, so two sessions kept at once count each other.
    tx.execute("SELECT 1 FROM tokens WHERE id = $1 FOR UPDATE", &[&s.token_id])
        .await
        .map_err(pg)?;
    let rows = tx
        .query(
            "UPDATE sessions SET revoked_us = $3 WHERE sha256 IN (
                 SELECT sha256 FROM sessions WHERE token_id = $1 AND revoked_us IS NULL
                  ORDER BY created_us DESC, sha256 DESC OFFSET $2)
             RETURNING sha256, created_us",
            &[&s.token_id, &i64::try_from(per_token).unwrap_or(i64::MAX), &micros(s.created_at)],
        )
        .await
        .map_err(pg)?;
    tx.commit().await.map_err(pg)?;
    let mut revoked: Vec<(i64, String)> = rows
        .iter()
        .map(|r| Ok((r.try_get(1).map_err(pg)?, r.try_get(0).map_err(pg)?)))
        .collect::<Result<_, Error>>()?;
    revoked.sort();
    Ok(revoked.into_iter().map(|(_, h)| h).collect())
}

/// The session whose hash is `sha256`.
pub(super) async fn by_hash(
    c: &deadpool_postgres::Object,
    sha256: &str,
) -> Result<Option<SessionRecord>, Error> {
    let stmt = c
        .prepare_cached(&format!("SELECT {COLUMNS} FROM sessions WHERE sha256 = $1"))
        .await
        .map_err(pg)?;
    let rows = c.query(&stmt, &[&sha256]).await.map_err(pg)?;
    rows.first().map(to_session).transpose()
}

/// Marks a session used at `at`.
pub(super) async fn touch(
    c: &deadpool_postgres::Object,
    sha256: &str,
    at: DateTime<Utc>,
) -> Result<(), Error> {
    let stmt =
        c.prepare_cached("UPDATE sessions SET seen_us = $2 WHERE sha256 = $1").await.map_err(pg)?;
    c.execute(&stmt, &[&sha256, &micros(at)]).await.map_err(pg)?;
    Ok(())
}

/// Revokes a session; false when there is none or it was revoked before.
pub(super) async fn revoke(
    c: &deadpool_postgres::Object,
    sha256: &str,
    at: DateTime<Utc>,
) -> Result<bool, Error> {
    let stmt = c
        .prepare_cached(
            "UPDATE sessions SET revoked_us = $2 WHERE sha256 = $1 AND revoked_us IS NULL",
        )
        .await
        .map_err(pg)?;
    Ok(c.execute(&stmt, &[&sha256, &micros(at)]).await.map_err(pg)? == 1)
}
