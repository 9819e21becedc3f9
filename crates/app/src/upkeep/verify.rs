//! Checking a database's logs, moving its schema forward, and copying it live.
//!
//! `verify` loads every run (or the ones named) through the store's checks — sequence from
//! 1 without gaps, each event against its hash in the chain, `last_seq` and the head hash.
//! The chain detects damage (a bad disk, a hand edit, a wrong restore), not tampering:
//! whoever can write the database can recompute it.

use std::path::Path;

use anyhow::bail;
use baton_engine::chain;
use baton_engine::store::Error;
use baton_store::SqliteStore;

use crate::place::Place;

/// What `verify` found about one run.
#[derive(Debug)]
pub enum Finding {
    Intact { last_seq: u64, head: String },
    Damaged { seq: Option<u64>, problem: String },
}

fn no_database(db: &Path) -> anyhow::Error {
    anyhow::anyhow!("no database at {}: name one with --db PATH", db.display())
}

/// What `migrate` did.
#[derive(Debug)]
pub enum Migrated {
    /// A PostgreSQL database (shown without its password) moved from one schema version to
    /// another (the same when it was current).
    Postgres { shown: String, from: i64, to: i64 },
    /// A SQLite database, which migrates when it is opened.
    Sqlite,
}

/// The database's schema moved forward to this binary's version.
pub async fn migrate(place: &Place) -> anyhow::Result<Migrated> {
    match &place.postgres {
        Some(url) => {
            let (from, to) = baton_store::PostgresStore::migrate(url).await?;
            Ok(Migrated::Postgres { shown: baton_store::postgres::shown(url), from, to })
        }
        None => {
            if !place.db.is_file() {
                return Err(no_database(&place.db));
            }
            SqliteStore::open_existing(&place.db)?;
            Ok(Migrated::Sqlite)
        }
    }
}

/// Checks every run of the database (or only `named`), each with what was found.
pub async fn verify(place: &Place, named: &[String]) -> anyhow::Result<Vec<(String, Finding)>> {
    // Opening a missing file would create an empty database and call it intact.
    if place.postgres.is_none() && !place.db.is_file() {
        return Err(no_database(&place.db));
    }
    let store = crate::place::open_any(place).await?;
    let ids: Vec<String> = if named.is_empty() {
        store.runs(None).await?.into_iter().map(|r| r.run_id).collect()
    } else {
        named.to_vec()
    };
    let mut findings = Vec::with_capacity(ids.len());
    for id in ids {
        let finding = match store.verify(&id).await {
            Ok(v) => Finding::Intact { last_seq: v.last_seq, head: chain::hex(&v.head) },
            Err(Error::Damaged { seq, problem, .. }) => {
                Finding::Damaged { seq: Some(seq), problem }
            }
            Err(Error::NotFound(_)) => {
                Finding::Damaged { seq: None, problem: "no such run in this database".to_owned() }
            }
            Err(e) => Finding::Damaged { seq: None, problem: e.to_string() },
        };
        findings.push((id, finding));
    }
    Ok(findings)
}

/// Copies the live SQLite database into the new file `dest`, in one consistent step; the
/// copy's size in bytes.
pub fn backup(place: &Place, dest: &Path) -> anyhow::Result<u64> {
    if let Some(url) = &place.postgres {
        bail!(
            "baton backup copies a SQLite database; back up the PostgreSQL database {} with its own tools (pg_dump, or the server's base backups and WAL archive)",
            baton_store::postgres::shown(url)
        );
    }
    let db = place.db.as_path();
    if !db.is_file() {
        return Err(no_database(db));
    }
    if std::fs::symlink_metadata(dest).is_ok() {
        bail!(
            "{} already exists; a backup never overwrites a file: name a new one",
            dest.display()
        );
    }
    baton_store::backup(db, dest)?;
    Ok(std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0))
}
