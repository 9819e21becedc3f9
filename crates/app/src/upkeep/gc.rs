//! `baton gc`: removes what no run owns from Baton's own directories beside the database.
//!
//! Three kinds of leftovers, each looked for only inside Baton's default directories and
//! never through a symbolic link out of them:
//! - workspace directories `workspaces/RUN` whose run is not in the store (a run killed
//!   before its first commit leaves one) — never a directory a run recorded as its
//!   workspace (`scenario_started.workspace.dir`: what the user named with `--workspace`
//!   included), and never one whose run or workspace lock is held;
//! - snapshot repositories `snapshots/KEY` no run of the store names (`KEY` is the
//!   [`snapshot_key`] of a run's recorded workspace) and whose workspace lock is free;
//! - run lock files `<db>.locks/RUN` that earlier versions kept per run (runs are now
//!   held by a lock on one byte of `<db>.holds`), of runs not in the store or ended, not
//!   held.
//!
//! A directory that holds another database's holds file (`OTHER.holds`) or lock directory
//! (`OTHER.locks`) is refused: whose workspaces are whose could not be told.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::bail;
use baton_engine::state::fold;
use baton_engine::store::EventStore;
use baton_store::SqliteStore;
use baton_store::sqlite::lock_file_held;
use baton_workspace::snapshot_key;

use crate::place::Place;

/// The statuses of runs that have ended: their lock files are no longer needed.
const ENDED: [&str; 4] = ["completed", "failed", "aborted", "cancelled"];

/// One thing gc removes, and why.
#[derive(Debug)]
pub struct Leftover {
    pub path: PathBuf,
    pub why: String,
}

/// What no run owns in Baton's directories beside the SQLite database at `place`.
pub async fn leftovers(place: &Place) -> anyhow::Result<Vec<Leftover>> {
    if place.postgres.is_some() {
        bail!(
            "baton gc cleans beside a SQLite database (its lock files tell which runs are driven); it is not offered for a PostgreSQL --db yet"
        );
    }
    if !place.db.exists() {
        bail!("no database at {}; pass the --db whose leftovers to remove", place.db.display());
    }
    let store = SqliteStore::open_existing(&place.db).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Every run of the store, with its status and the workspace it recorded.
    let mut runs: BTreeMap<String, String> = BTreeMap::new();
    let mut recorded: BTreeSet<PathBuf> = BTreeSet::new();
    for record in store.runs(None).await? {
        let events = store.load(&record.run_id, 0).await?;
        if let Some(info) = fold(&events).workspace {
            recorded.insert(PathBuf::from(info.dir));
        }
        runs.insert(record.run_id, record.status);
    }
    let owned_keys: BTreeSet<String> = recorded.iter().map(|dir| snapshot_key(dir)).collect();
    let data = place.db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let workspaces = data.join("workspaces");
    let snapshots = place.snapshots.clone().unwrap_or_else(|| data.join("snapshots"));
    let locks = store.locks_dir();
    let holds = store.holds();
    // Workspaces and snapshots live beside the database: with another database there, gc
    // could not tell whose they are.
    let others: Vec<String> = entries(data)?
        .into_iter()
        .filter(|(name, path)| {
            (name.ends_with(".locks") && path.is_dir() && *path != locks)
                || (name.ends_with(".holds") && path.is_file() && path != holds.path())
        })
        .map(|(name, _)| name)
        .collect();
    if !others.is_empty() {
        bail!(
            "{} holds the data of other databases too ({}), whose workspaces and snapshots gc cannot tell from this one's; keep each database in a directory of its own",
            data.display(),
            others.join(", ")
        );
    }

    let mut leftovers = Vec::new();
    for (name, path) in entries(&workspaces)? {
        // The file that names the place (and its drafts) is no run's workspace.
        if name.starts_with(baton_workspace::HOME_FILE) {
            continue;
        }
        if runs.contains_key(&name)
            || holds.is_held(&name).unwrap_or(true)
            || lock_file_held(&locks.join(&name)).unwrap_or(true)
        {
            continue;
        }
        // A directory a run recorded (named with --workspace inside this one) is the user's.
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if recorded.contains(&canonical) || recorded.contains(&path) {
            continue;
        }
        let key = snapshot_key(&canonical);
        if lock_file_held(&snapshots.join(&key).join("lock")).unwrap_or(true) {
            continue;
        }
        leftovers.push(Leftover {
            path,
            why: format!("workspace of run {name}, which the store does not hold"),
        });
    }
    for (key, path) in entries(&snapshots)? {
        if owned_keys.contains(&key) || lock_file_held(&path.join("lock")).unwrap_or(true) {
            continue;
        }
        leftovers
            .push(Leftover { path, why: "snapshot repository of no run in the store".to_owned() });
    }
    for (name, path) in entries(&locks)? {
        let why = match runs.get(&name) {
            None => format!("lock of run {name}, which the store does not hold"),
            Some(status) if ENDED.contains(&status.as_str()) => {
                format!("lock of run {name}, which has ended ({status})")
            }
            Some(_) => continue,
        };
        if lock_file_held(&path).unwrap_or(true) {
            continue;
        }
        leftovers.push(Leftover { path, why });
    }

    Ok(leftovers)
}

/// The entries of one of Baton's directories, by name (none when it does not exist).
/// Names that are not text are skipped: Baton never writes one.
fn entries(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => bail!("cannot list {}: {e}", dir.display()),
    };
    let mut found = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| anyhow::anyhow!("cannot list {}: {e}", dir.display()))?;
        if let Ok(name) = entry.file_name().into_string() {
            found.push((name, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Removes a file, a symbolic link (never what it points to) or a directory tree (whose
/// links are removed, not followed).
pub fn remove(path: &Path) -> std::io::Result<()> {
    let metadata = std::fs::symlink_metadata(path)?;
    if metadata.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) }
}
