//! `baton purge`: retention. Removes whole jobs that ended before a time — every run of the
//! job from the store (record, events, holds, leases: the log is gone from the database,
//! SQLite's deleted pages overwritten and its write-ahead log emptied, PostgreSQL's tables
//! vacuumed) and, from Baton's own directories, the workspaces those runs made and their
//! snapshot repositories.
//!
//! A job goes only when every one of its runs has ended and the last of them changed before
//! the time; `--keep-failed` keeps jobs with a failed or aborted run. An operator can also
//! name one job (`--job`, by any of its runs): it goes whenever it ended, and with
//! `--unended` even when some of its runs have not — a run left half-made, with links that
//! never completed, is deleted this way instead of being repaired by guesswork. A workspace directory
//! is removed only when it lies in Baton's `workspaces/` directory (one the user named with
//! `--workspace` is the user's), and a snapshot repository only when no run that stays
//! names the same workspace. Nothing a process holds is touched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use baton_engine::state::{Status, fold};
use baton_engine::store::RunRecord;
use baton_workspace::snapshot_key;
use chrono::{DateTime, Utc};

use crate::place::{Place, open_existing_store};

/// The time `--finished-before` names: an RFC 3339 time, or an age (`30d`, `12h`, `45m`,
/// `90s`) counted back from now.
pub fn parse_before(text: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let seconds_per = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => 0,
    };
    match number.parse::<i64>() {
        Ok(n) if seconds_per > 0 && (0..=36_500 * 86_400 / seconds_per).contains(&n) => {
            Ok(now - chrono::Duration::seconds(n * seconds_per))
        }
        _ => bail!(
            "--finished-before {}: give an RFC 3339 time (2026-11-01T00:00:00Z) or an age such as 30d, 12h, 45m or 90s",
            text.chars().take(64).collect::<String>().escape_debug()
        ),
    }
}

/// One job that goes: its runs.
#[derive(Debug)]
pub struct Doomed {
    pub root: String,
    pub runs: Vec<String>,
}

/// What a purge removes: the jobs, their runs, and the directories they leave (each with
/// what it is).
#[derive(Debug)]
pub struct Purge {
    pub before: DateTime<Utc>,
    pub doomed: Vec<Doomed>,
    pub runs: Vec<String>,
    pub paths: Vec<(PathBuf, String)>,
}

/// Which jobs a purge takes.
#[derive(Clone, Debug)]
pub enum Which {
    /// Every job that ended before the time (`--finished-before`), but failed ones with
    /// `keep_failed`.
    EndedBefore { before: DateTime<Utc>, keep_failed: bool },
    /// The job of this run (`--job`), ended or, with `unended`, not.
    Job { run_id: String, unended: bool },
}

/// The jobs of `place` that `which` names, and what purging them removes. A job named
/// alone is refused, saying why, when it has not ended (without `unended`) or a process
/// drives one of its runs.
pub async fn plan(place: &Place, which: &Which) -> anyhow::Result<Purge> {
    let store = open_existing_store(place).await?;
    let all = store.runs(None).await?;
    // Every run, by its job (a root stands for its own job).
    let mut jobs: BTreeMap<String, Vec<&RunRecord>> = BTreeMap::new();
    for r in &all {
        let root = r.root_run_id.clone().unwrap_or_else(|| r.run_id.clone());
        jobs.entry(root).or_default().push(r);
    }
    let named = match which {
        Which::Job { run_id, .. } => {
            let Some(r) = all.iter().find(|r| &r.run_id == run_id) else {
                return Err(crate::error::Error::not_found(format!(
                    "no run {run_id} in {}",
                    place.db_shown()
                ))
                .into());
            };
            Some(r.root_run_id.clone().unwrap_or_else(|| r.run_id.clone()))
        }
        Which::EndedBefore { .. } => None,
    };
    let before = match which {
        Which::EndedBefore { before, .. } => *before,
        Which::Job { .. } => Utc::now(),
    };
    let mut doomed = Vec::new();
    for (root, runs) in &jobs {
        if named.as_ref().is_some_and(|n| n != root) {
            continue;
        }
        let open: Vec<&&RunRecord> = runs
            .iter()
            .filter(|r| !Status::from_name(&r.status).is_some_and(Status::is_final))
            .collect();
        let last_change = runs.iter().map(|r| r.updated_at).max();
        let failed = runs.iter().any(|r| matches!(r.status.as_str(), "failed" | "aborted"));
        match which {
            Which::EndedBefore { before, keep_failed } => {
                if !open.is_empty()
                    || last_change.is_none_or(|t| t >= *before)
                    || (*keep_failed && failed)
                {
                    continue;
                }
            }
            Which::Job { unended, .. } => {
                if !open.is_empty() && !unended {
                    let listed: Vec<String> =
                        open.iter().map(|r| format!("{} ({})", r.run_id, r.status)).collect();
                    return Err(crate::error::Error::refused(format!(
                        "job {root} has runs that have not ended: {}; add --unended to remove it anyway (cancel it first to keep its record)",
                        listed.join(", ")
                    ))
                    .into());
                }
            }
        }
        let mut held = None;
        for r in runs {
            if store.is_held(&r.run_id).await? {
                held = Some(r.run_id.clone());
            }
        }
        if let Some(held) = held {
            if named.is_some() {
                return Err(crate::error::Error::refused(format!(
                    "run {held} of job {root} is being driven by a process; stop it (`baton cancel {root}`) before removing the job"
                ))
                .into());
            }
            continue;
        }
        doomed.push(Doomed {
            root: root.clone(),
            runs: runs.iter().map(|r| r.run_id.clone()).collect(),
        });
    }
    let going: BTreeSet<&str> =
        doomed.iter().flat_map(|d| d.runs.iter().map(String::as_str)).collect();
    // The workspaces runs recorded: the doomed ones', and the ones runs that stay still use.
    let mut doomed_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut kept_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for r in &all {
        let events = store.load(&r.run_id, 0).await?;
        if let Some(info) = fold(&events).workspace {
            let dir = PathBuf::from(info.dir);
            if going.contains(r.run_id.as_str()) {
                doomed_dirs.insert(dir);
            } else {
                kept_dirs.insert(dir);
            }
        }
    }
    let data = crate::place::data_dir(place);
    let workspaces = data.join("workspaces");
    let snapshots = place.snapshots.clone().unwrap_or_else(|| data.join("snapshots"));
    let mut paths: Vec<(PathBuf, String)> = Vec::new();
    for dir in doomed_dirs.difference(&kept_dirs) {
        if dir.parent() == Some(workspaces.as_path()) && dir.is_dir() {
            paths.push((dir.clone(), "workspace".to_owned()));
        }
        let repository = snapshots.join(snapshot_key(dir));
        if repository.is_dir() {
            paths.push((repository, format!("snapshots of {}", dir.display())));
        }
    }
    let runs: Vec<String> = going.iter().map(|s| (*s).to_owned()).collect();
    Ok(Purge { before, doomed, runs, paths })
}

/// Removes the runs of `purge` from the store; how many were there to remove.
pub async fn remove_runs(place: &Place, purge: &Purge) -> anyhow::Result<u64> {
    let store = open_existing_store(place).await?;
    store.purge(&purge.runs).await.context("the runs were not purged")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn before_is_a_time_or_an_age() {
        let now = DateTime::parse_from_rfc3339("2026-12-03T00:00:00Z").unwrap().with_timezone(&Utc);
        let at = |s: &str| parse_before(s, now).map(|t| t.to_rfc3339());
        assert_eq!(at("2026-11-01T00:00:00Z").unwrap(), "2026-11-01T00:00:00+00:00");
        assert_eq!(at("30d").unwrap(), "2026-11-03T00:00:00+00:00");
        assert_eq!(at("12h").unwrap(), "2026-12-02T12:00:00+00:00");
        assert_eq!(at("90s").unwrap(), "2026-12-02T23:58:30+00:00");
        for bad in ["", "d", "-3d", "3w", "yesterday", "99999999d"] {
            assert!(at(bad).is_err(), "{bad}");
        }
    }
}
