//! `baton verify`, `baton migrate` and `baton backup`, as the application layer's
//! `upkeep::verify` does them: one line per damaged run, what moved, what was copied.

use std::path::Path;
use std::process::ExitCode;

use baton_app::place::Place;
use baton_app::upkeep::verify::{self as upkeep, Finding, Migrated};
use serde_json::json;

use crate::escape;
use crate::out::outln;

/// `baton migrate`: the database's schema moved forward to this binary's version.
pub(crate) async fn migrate(place: &Place) -> anyhow::Result<ExitCode> {
    match upkeep::migrate(place).await? {
        Migrated::Postgres { shown, from, to } if from == to => {
            outln!("{shown} is at schema version {to} already; nothing to do")?;
        }
        Migrated::Postgres { shown, from, to } => {
            outln!("{shown}: schema version {from} → {to}; every run is kept")?;
        }
        Migrated::Sqlite => outln!(
            "{} is at this binary's schema version (SQLite migrates when opened)",
            place.db.display()
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks every run of the database (or only `named`); exit 0 when all are intact, 1
/// otherwise.
pub(crate) async fn verify(
    place: &Place,
    named: &[String],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let findings = upkeep::verify(place, named).await?;
    let damaged = findings.iter().filter(|(_, f)| matches!(f, Finding::Damaged { .. })).count();
    if json {
        let runs: Vec<_> = findings
            .iter()
            .map(|(id, f)| match f {
                Finding::Intact { last_seq, head, chain } => {
                    json!({"run_id": id, "intact": true, "last_seq": last_seq, "head": head, "chain": chain})
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

/// Copies the live database into the new file `dest`, in one consistent step.
pub(crate) fn backup(place: &Place, dest: &Path) -> anyhow::Result<ExitCode> {
    let bytes = upkeep::backup(place, dest)?;
    outln!(
        "backed up {} to {} ({bytes} bytes); check the copy with `baton verify --db {}`",
        place.db.display(),
        dest.display(),
        dest.display()
    )?;
    Ok(ExitCode::SUCCESS)
}
