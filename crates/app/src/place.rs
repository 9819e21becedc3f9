//! Where an instance's runs live and where its scenarios are read from ([`Place`]), and
//! opening its store: SQLite or PostgreSQL, created when absent or required to exist.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::bail;
use baton_engine::store::EventStore;
use baton_store::{PostgresStore, SqliteStore, Store};
pub use baton_workspace::HandOff;

/// Whether `db` names a PostgreSQL database (`postgres://…`, `postgresql://…`) rather than
/// a SQLite file.
pub fn is_postgres_url(db: &str) -> bool {
    baton_store::postgres::is_url(db)
}

/// Where runs live and where scenarios are read from.
#[derive(Debug, Clone)]
pub struct Place {
    /// The SQLite database; with a PostgreSQL `--db`, a path in Baton's own directory
    /// (`--data`) that names no file — workspaces and snapshots live beside it either way.
    pub db: PathBuf,
    /// The PostgreSQL database `--db` names, when it names one.
    pub postgres: Option<String>,
    /// How long this process's holds on runs in a PostgreSQL database last without a
    /// renewal (`baton worker --lease-s`); none: the store's default.
    pub hold_for: Option<std::time::Duration>,
    pub scenarios: PathBuf,
    /// The provider configuration given with `--config`.
    pub config: Option<PathBuf>,
    /// Where snapshot repositories live (`--snapshots`; default `snapshots/` beside the
    /// database).
    pub snapshots: Option<PathBuf>,
    /// `--no-jail`: programs run unconfined.
    pub no_jail: bool,
    /// `--object-store`: where workspaces' snapshots are handed off between hosts.
    pub handoff: Option<Arc<HandOff>>,
}

impl Place {
    /// Where `--db` (a SQLite file or a PostgreSQL URL) and `--data-dir` put runs, with the
    /// scenarios, configuration and snapshots given and no hold set; `None` for a
    /// `--data-dir` beside a SQLite database, which keeps its files in its own directory.
    pub fn of_database(
        db: &Path,
        data_dir: Option<&Path>,
        scenarios: PathBuf,
        config: Option<PathBuf>,
        snapshots: Option<PathBuf>,
        no_jail: bool,
    ) -> Option<Place> {
        let postgres = db.to_str().filter(|db| is_postgres_url(db)).map(str::to_owned);
        let db = match (&postgres, data_dir) {
            (Some(_), data) => data.unwrap_or(Path::new(".baton")).join("baton.db"),
            (None, None) => db.to_path_buf(),
            (None, Some(_)) => return None,
        };
        Some(Place {
            db,
            postgres,
            hold_for: None,
            scenarios,
            config,
            snapshots,
            no_jail,
            handoff: None,
        })
    }

    /// The run database as messages name it (a PostgreSQL URL without its password).
    pub fn db_shown(&self) -> String {
        match &self.postgres {
            Some(url) => baton_store::postgres::shown(url),
            None => self.db.display().to_string(),
        }
    }

    /// Whether the run database exists (a PostgreSQL database always does: its tables are
    /// made on first use).
    pub fn db_exists(&self) -> bool {
        self.postgres.is_some() || self.db.exists()
    }
}

/// The run database (its runs and its tokens), created when absent.
pub async fn open_any(place: &Place) -> anyhow::Result<Arc<dyn Store>> {
    // Every batch this process writes names it as `run_resumed.process` does.
    baton_engine::store::name_writer(&this_process());
    Ok(match &place.postgres {
        Some(url) => Arc::new(
            PostgresStore::connect_holding(
                url,
                place.hold_for.unwrap_or(baton_store::postgres::DEFAULT_HOLD_FOR),
            )
            .await
            .map_err(store_error)?,
        ),
        None => Arc::new(SqliteStore::open(&place.db).map_err(store_error)?),
    })
}

/// The run database, created when absent: for commands that start runs.
pub async fn open_store(place: &Place) -> anyhow::Result<Arc<dyn EventStore>> {
    Ok(open_any(place).await?)
}

/// The run database, which must exist: for commands that read runs or change existing
/// ones. Nothing is created, so a mistyped `--db` leaves no directories or empty database.
pub async fn open_existing_any(place: &Place) -> anyhow::Result<Arc<dyn Store>> {
    if place.postgres.is_some() {
        return open_any(place).await;
    }
    if !place.db.exists() {
        bail!("no database at {}; start a run first or pass --db", place.db.display());
    }
    baton_engine::store::name_writer(&this_process());
    let store = SqliteStore::open_existing(&place.db).map_err(store_error)?;
    Ok(Arc::new(store))
}

/// [`open_existing_any`], for its runs.
pub async fn open_existing_store(place: &Place) -> anyhow::Result<Arc<dyn EventStore>> {
    Ok(open_existing_any(place).await?)
}

/// A store's error as the user reads it: the store names the path and the reason.
pub fn store_error(e: baton_engine::store::Error) -> anyhow::Error {
    match e {
        baton_engine::store::Error::Backend(message) => anyhow::Error::msg(message),
        other => other.into(),
    }
}

/// Baton's own directory: the database's.
pub fn data_dir(place: &Place) -> PathBuf {
    let data = place.db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf())
}

/// The configuration file to read: `--config`, else ./baton.toml when something is
/// there — whatever is there is read (and refused when it is not a regular file), never
/// silently skipped.
pub fn config_file(config: Option<&Path>) -> Option<PathBuf> {
    config.map(Path::to_path_buf).or_else(|| {
        let default = PathBuf::from("baton.toml");
        std::fs::symlink_metadata(&default).is_ok().then_some(default)
    })
}

/// This process as `run_resumed.process` names it by default: `host:pid`, worked out once.
pub fn this_process() -> Arc<str> {
    static PROCESS: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    Arc::clone(
        PROCESS
            .get_or_init(|| Arc::from(format!("{}:{}", host_name(), std::process::id()).as_str())),
    )
}

/// This machine's name as the kernel gives it (letters, digits and `-`, at most 64), for
/// naming processes; `host` when it cannot be read.
pub fn host_name() -> String {
    use std::io::Read as _;
    let mut read = String::new();
    let _ = std::fs::File::open("/proc/sys/kernel/hostname")
        .and_then(|f| f.take(256).read_to_string(&mut read));
    let name: String =
        read.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(64).collect();
    if name.is_empty() { "host".to_owned() } else { name }
}
