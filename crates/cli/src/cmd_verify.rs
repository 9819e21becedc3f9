//! `baton verify` and `baton backup`: checking a database's logs, and copying it live.
//!
//! `verify` loads every run (or the ones named) through the store's checks — sequence from
//! 1 without gaps, each event against its hash in the chain, `last_seq` and the head hash —
//! and prints one line per damaged run. The chain detects damage (a bad disk, a hand edit,
//! a wrong restore), not tampering: whoever can write the database can recompute it.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use baton_engine::chain;
use baton_engine::store::Error;
use baton_store::SqliteStore;
use serde_json::json;

use crate::escape;
use crate::out::outln;

/// What `verify` found about one run.
enum Finding {
    Intact { last_seq: u64, head: String },
    Damaged { seq: Option<u64>, problem: String },
}

fn no_database(db: &Path) -> anyhow::Error {
    anyhow::anyhow!("no database at {}: name one with --db PATH", db.display())
}

/// `baton migrate`: the database's schema moved forward to this binary's version.
pub(crate) async fn migrate(place: &crate::cmd_run::Place) -> anyhow::Result<ExitCode> {
    match &place.postgres {
        Some(url) => {
            let (from, to) = baton_store::PostgresStore::migrate(url).await?;
            let shown = baton_store::postgres::shown(url);
            if from == to {
                outln!("{shown} is at schema version {to} already; nothing to do")?;
            } else {
                outln!("{shown}: schema version {from} → {to}; every run is kept")?;
            }
        }
        None => {
            if !place.db.is_file() {
                return Err(no_database(&place.db));
            }
            SqliteStore::open_existing(&place.db)?;
            outln!(
                "{} is at this binary's schema version (SQLite migrates when opened)",
                place.db.display()
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks every run of the database at `db` (or only `named`); exit 0 when all are intact,
/// 1 otherwise.
pub(crate) async fn verify(
    place: &crate::cmd_run::Place,
    named: &[String],
    json: bool,
) -> anyhow::Result<ExitCode> {
    // Opening a missing file would create an empty database and call it intact.
    if place.postgres.is_none() && !place.db.is_file() {
        return Err(no_database(&place.db));
    }
    let store = crate::cmd_run::open_any(place).await?;
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
    let damaged = findings.iter().filter(|(_, f)| matches!(f, Finding::Damaged { .. })).count();
    if json {
        let runs: Vec<_> = findings
            .iter()
            .map(|(id, f)| match f {
                Finding::Intact { last_seq, head } => {
                    json!({"run_id": id, "intact": true, "last_seq": last_seq, "head": head})
                }
                Finding::Damaged { seq, problem } => {
                    json!({"run_id": id, "intact": false, "seq": seq, "problem": problem})
                }
            })
            .collect();
        let report = json!({"database": place.db_shown(), "ok": damaged == 0, "runs": runs});
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        for (id, f) in &findings {
            match f {
                Finding::Damaged { seq: Some(seq), problem } => {
                    outln!("damaged: run {id} at event {seq}: {}", escape::one_line(problem))?;
                }
                Finding::Damaged { seq: None, problem } => {
                    outln!("damaged: run {id}: {}", escape::one_line(problem))?;
                }
                Finding::Intact { .. } => {}
            }
        }
        if damaged == 0 {
            outln!("ok: {} runs intact in {}", findings.len(), place.db_shown())?;
        } else {
            outln!(
                "{damaged} of {} runs damaged in {}; restore them from a backup",
                findings.len(),
                place.db_shown()
            )?;
        }
    }
    Ok(if damaged == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Copies the live database at `db` into the new file `dest`, in one consistent step.
pub(crate) fn backup(place: &crate::cmd_run::Place, dest: &Path) -> anyhow::Result<ExitCode> {
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
    let bytes = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
    outln!(
        "backed up {} to {} ({bytes} bytes); check the copy with `baton verify --db {}`",
        db.display(),
        dest.display(),
        dest.display()
    )?;
    Ok(ExitCode::SUCCESS)
}
