//! Checking a database's logs, moving its schema forward, and copying it live.
//!
//! `verify` loads every run (or the ones named) through the store's checks — sequence from
//! 1 without gaps, each event against its hash in the chain, `last_seq` and the head hash.
//! The chain detects damage (a bad disk, a hand edit, a wrong restore), not tampering:
//! whoever can write the database can recompute it. The scenario versions a run is pinned
//! to are checked too: their stored texts must load and hash to their checksum; and so is
//! the run's record, a cache of its log: its status must be the folded log's.

use std::path::Path;

use anyhow::bail;
use baton_engine::chain;
use baton_engine::store::Error;
use baton_store::SqliteStore;

use crate::place::Place;

/// What `verify` found about one run.
#[derive(Debug)]
pub enum Finding {
    /// `chain` names how its events are hashed (the form recorded with the run).
    Intact {
        last_seq: u64,
        head: String,
        chain: &'static str,
    },
    Damaged {
        seq: Option<u64>,
        problem: String,
    },
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
    let mut versions = Versions::default();
    for id in ids {
        let finding = match store.verify(&id).await {
            Ok(v) => {
                let problem = match versions.check_run(place, store.as_ref(), &id).await? {
                    Some(problem) => Some(problem),
                    None => record_problem(store.as_ref(), &id).await?,
                };
                match problem {
                    Some(problem) => Finding::Damaged { seq: None, problem },
                    None => Finding::Intact {
                        last_seq: v.last_seq,
                        head: chain::hex(&v.head),
                        chain: match v.form {
                            chain::Form::Encoded => "sha256-encoded",
                            chain::Form::CanonicalJson => "sha256-canonical-json",
                        },
                    },
                }
            }
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

/// What is wrong with the run's record, which caches what its log says: its status must
/// be the one the folded log gives (the record is never the truth — every decision is
/// taken on the log — but listings and filters read it).
async fn record_problem(
    store: &dyn baton_engine::store::EventStore,
    run_id: &str,
) -> anyhow::Result<Option<String>> {
    let Some(record) = store.run(run_id).await? else { return Ok(None) };
    let state = baton_engine::state::fold(&store.load(run_id, 0).await?);
    let folded = state.recorded_status().as_str();
    Ok((record.status != folded).then(|| {
        format!(
            "the run's record says `{}` but its log says `{folded}`: the log is intact and decides; the record, a cache of it, is rewritten by the run's next event (`baton resume {run_id}`, a decision), or restore a backup",
            record.status
        )
    }))
}

/// The scenario versions `verify` has checked, each with what was wrong with its stored
/// texts (none when they load and hash to their checksum).
#[derive(Default)]
struct Versions {
    checked: std::collections::HashMap<String, Option<String>>,
}

impl Versions {
    /// What is wrong with the stored texts of the scenario versions a run is pinned to
    /// (its `scenario_started` and every `scenario_upgraded`): texts that no longer load, or
    /// load to another checksum, mean the database was changed. A version kept by nobody
    /// (a run from before versions were kept) is not a finding.
    async fn check_run(
        &mut self,
        place: &Place,
        store: &dyn baton_engine::store::EventStore,
        run_id: &str,
    ) -> anyhow::Result<Option<String>> {
        use baton_engine::event::EventData;
        let events = store.load(run_id, 0).await?;
        for e in &events {
            let (scenario, checksum) = match &e.data {
                EventData::ScenarioStarted(s) => (&s.scenario_id, &s.checksum),
                EventData::ScenarioUpgraded(u) => (&String::new(), &u.checksum),
                _ => continue,
            };
            if !self.checked.contains_key(checksum) {
                let problem = version_problem(place, store, scenario, checksum).await?;
                self.checked.insert(checksum.clone(), problem);
            }
            if let Some(Some(problem)) = self.checked.get(checksum) {
                return Ok(Some(format!("pinned to a damaged scenario version: {problem}")));
            }
        }
        Ok(None)
    }
}

/// What is wrong with the texts stored under `checksum`, if anything.
async fn version_problem(
    place: &Place,
    store: &dyn baton_engine::store::EventStore,
    scenario: &str,
    checksum: &str,
) -> anyhow::Result<Option<String>> {
    let Some(json) = store.scenario_texts(checksum).await? else { return Ok(None) };
    let short: String = checksum.chars().take(12).collect();
    let texts: baton_scenario::model::Texts = match serde_json::from_str(&json) {
        Ok(texts) => texts,
        Err(e) => return Ok(Some(format!("the texts stored for {short}… do not read: {e}"))),
    };
    let name = format!("{scenario} (stored version {short}…)");
    Ok(match baton_scenario::Registry::load_texts(&name, &place.scenarios, &texts) {
        Err(e) => Some(format!("the texts stored for {short}… do not load: {e}")),
        Ok(loaded) if loaded.checksum != checksum => Some(format!(
            "the texts stored for {short}… hash to {}, not to {checksum}",
            loaded.checksum
        )),
        Ok(_) => None,
    })
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
