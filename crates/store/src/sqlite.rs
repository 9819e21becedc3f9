//! The embedded SQLite store: one file in WAL mode, one writer thread, group commit,
//! reader threads.
//!
//! Every write goes to a dedicated thread that owns the writer connection. The thread
//! takes every request waiting in its queue at once and writes all of their appends in one
//! transaction (each inside its own savepoint, so one conflicting append fails alone), so
//! concurrent runs share a commit — and its fsync. Reads go to two reader threads, each
//! with a connection of its own, so that they never wait behind a group commit. `synchronous = FULL`: a committed
//! event survives a power loss, not only a crash of the process.
//!
//! Every event is stored with its hash in the engine's chain ([`baton_engine::chain`]) and
//! every run with its head hash; loading a run checks both, and every column it reads, and
//! refuses a damaged log naming the run and the first bad event. [`backup`] copies a live
//! database in one step.
//!
//! Test failpoints: with `BATON_FAILPOINT_ABORT_AFTER_EVENT=N` in the environment, the
//! process aborts right after the commit that makes any event numbered N or more durable;
//! with `BATON_FAILPOINT_CANCEL_AFTER_EVENT=N`, a `cancel_requested` is appended to that run
//! right after that commit, before its writer hears back — as if `baton cancel` from
//! another process got in first — so a test can cancel a run at every event; with
//! `BATON_FAILPOINT_ABORT_AFTER_WRITES=N`, it aborts right after the commit that makes the
//! N-th event this process wrote durable, whichever runs they belong to (a job's tree); with
//! `BATON_FAILPOINT_CANCEL_ROOT_AFTER_WRITES=N`, a `cancel_requested` is appended to the
//! job's root right after that commit (a cancel at any point of a wave's tree); with
//! `BATON_FAILPOINT_CANCEL_BEFORE_KIND=KIND`, a `cancel_requested` is appended to every
//! unended run of a job's tree (as `baton cancel` of its root writes them) right before the
//! first append of this process that holds an event of that kind, so that append is refused
//! as another writer's would be (a cancel that got in between a step's result and its
//! commit). The decision barrier of `crate::barrier` holds its append in the writer.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use baton_engine::chain::{self, Fields, GENESIS, Hash};
use baton_engine::event::{Event, EventData};
use baton_engine::model::BoxFuture;
use baton_engine::store::{
    Error, EventStore, FeedCursor, FeedRef, RunGuard, RunQuery, RunRecord, TenantOverride, Verified,
};
use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use tokio::sync::oneshot;

use crate::run_holds::RunHolds;
use crate::schema::SqliteFill;
use crate::schema::{self, Backend};
use crate::sqlite_log::{Dicts, Packer, Ready, pack_existing_runs};
pub use crate::sqlite_log::{RawBatch, RawEvent, put_raw_batches, raw_batches};
use crate::sqlite_queues::QueueOp;
use crate::sqlite_rows::{RUN_COLUMNS, backend, cached_row, to_record};
use crate::sqlite_webhooks::WebhookOp;
use crate::tokens::{Role, SessionRecord, TokenRecord, TokenStore};

/// Most tries to prepare a database that another process is preparing at the same moment
/// (waits growing by 10 ms), all within [`OPEN_BUSY_WAIT`].
const OPEN_BUSY_TRIES_MAX: u32 = 44;

/// The most opening a database waits for other processes' locks, every try together.
const OPEN_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether SQLite refused for a lock another connection holds.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Most requests taken into one group commit.
const GROUP_MAX: usize = 256;

/// Reader connections (and threads) beside the writer's.
const READERS: usize = 2;

/// The page cache of each reader connection, in KiB (negative: SQLite's unit for KiB).
const READER_CACHE_KIB: i64 = -1024;

/// Commits between two checkpoints of the WAL into the database file. Checkpoints are
/// run here rather than by SQLite's page count so that the syncs they cost are counted.
const COMMITS_PER_CHECKPOINT: u64 = 500;

type Reply<T> = oneshot::Sender<Result<T, Error>>;

enum Request {
    Create(Box<RunRecord>, Vec<Event>, Vec<Ready>, Reply<()>),
    Append {
        run_id: String,
        expected: u64,
        events: Vec<Event>,
        ready: Vec<Ready>,
        status: String,
        reply: Reply<()>,
    },
    Load {
        run_id: String,
        after: u64,
        reply: Reply<Vec<Event>>,
    },
    Verify {
        run_id: String,
        reply: Reply<Verified>,
    },
    Run {
        run_id: String,
        reply: Reply<Option<RunRecord>>,
    },
    Writers {
        run_id: String,
        reply: Reply<Vec<(u64, String)>>,
    },
    RunsNamed {
        ids: Vec<String>,
        reply: Reply<Vec<Option<RunRecord>>>,
    },
    RunByKey {
        tenant: Option<String>,
        key: String,
        reply: Reply<Option<RunRecord>>,
    },
    KeysHeld {
        tenant: Option<String>,
        limit: u64,
        reply: Reply<u64>,
    },
    PutOverride {
        o: TenantOverride,
        reply: Reply<()>,
    },
    Overrides {
        tenant: Option<String>,
        reply: Reply<Vec<TenantOverride>>,
    },
    RemoveOverride {
        tenant: String,
        scenario_id: String,
        reply: Reply<bool>,
    },
    Runs {
        status: Option<String>,
        reply: Reply<Vec<RunRecord>>,
    },
    Lease(LeaseOp, Reply<LeaseAnswer>),
    Checkpoint(Reply<()>),
    PutTexts {
        checksum: String,
        scenario_id: String,
        texts: String,
        reply: Reply<bool>,
    },
    Texts {
        checksum: String,
        reply: Reply<Option<String>>,
    },
    RunsPage {
        query: RunQuery,
        reply: Reply<Vec<RunRecord>>,
    },
    Feed {
        tenant: Option<Option<String>>,
        after: FeedCursor,
        limit: usize,
        reply: Reply<Vec<FeedRef>>,
    },
    Purge {
        ids: Vec<String>,
        reply: Reply<u64>,
    },
    Token(TokenOp),
    Webhook(WebhookOp),
    Queue(crate::sqlite_queues::QueueOp),
}

/// A read or change of the tokens table, done by the connection's thread.
enum TokenOp {
    Put(TokenRecord, Reply<()>),
    ByHash(String, Reply<Option<TokenRecord>>),
    List(Option<String>, Reply<Vec<TokenRecord>>),
    Revoke(String, DateTime<Utc>, Reply<bool>),
    PutSession(Box<SessionRecord>, usize, DateTime<Utc>, Reply<Vec<String>>),
    SessionByHash(String, Reply<Option<SessionRecord>>),
    TouchSession(String, DateTime<Utc>, Reply<()>),
    RevokeSession(String, DateTime<Utc>, Reply<bool>),
}

/// A change to a lease, done by the writer thread.
enum LeaseOp {
    /// `queues`: `,a,b,` (queue names hold no comma); none for every queue.
    Claim {
        worker: String,
        now: i64,
        until: i64,
        queues: Option<String>,
        home: Option<String>,
    },
    Renew {
        run_id: String,
        worker: String,
        now: i64,
        until: i64,
    },
    Release {
        run_id: String,
        worker: String,
    },
}

enum LeaseAnswer {
    Claimed(Option<Box<RunRecord>>),
    Renewed(bool),
    Released,
}

/// Whether a lock file (a workspace's or snapshot's, or a run's lock file an earlier
/// version left in `<database>.locks`) is locked by some process: tried without waiting, and
/// unlocked at once when the try takes it. A missing file is not held.
pub fn lock_file_held(path: &Path) -> Result<bool, Error> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(Error::Backend(format!(
                "cannot open the run lock {}: {e}",
                path.display()
            )));
        }
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(false),
        Err(std::fs::TryLockError::WouldBlock) => Ok(true),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::Backend(format!("cannot check the run lock {}: {e}", path.display())))
        }
    }
}

/// Runs and events in one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    requests: mpsc::Sender<Request>,
    /// Reads that need no write: served by the reader connections, which never wait for
    /// the writer (WAL: each read sees the last commit before it began).
    reads: mpsc::Sender<Request>,
    path: PathBuf,
    stats: Arc<Stats>,
    /// The holds this store takes on runs (one open file, shared by its clones).
    holds: RunHolds,
}

/// What the writer thread has done, for benchmarks.
#[derive(Debug, Default)]
struct Stats {
    commits: AtomicU64,
    checkpoints: AtomicU64,
    /// Pages the writer connection's commits wrote to the WAL.
    wal_frames: AtomicU64,
    /// The WAL's size in pages after the last commit (0 once a checkpoint emptied it).
    wal_seen: AtomicU64,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Request")
    }
}

impl SqliteStore {
    /// The directory where earlier versions kept a lock file per run: `<database>.locks`
    /// (`baton gc` removes what is left in it).
    pub fn locks_dir(&self) -> PathBuf {
        let mut dir = self.path.clone().into_os_string();
        dir.push(".locks");
        PathBuf::from(dir)
    }

    /// The holds of this database's runs (`<database>.holds`), as this store takes them.
    pub fn holds(&self) -> &RunHolds {
        &self.holds
    }

    /// Opens (creating when absent) the database at `path` and brings its schema up to date.
    /// What it creates is its user's alone, whatever the umask: directories 0700, the file
    /// 0600 — and SQLite gives the WAL and shared-memory files the database file's mode.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| Error::Backend(format!("cannot create {}: {e}", dir.display())))?;
        }
        // Where the file cannot be made, SQLite's open below cannot make it either, and
        // its failure is the one diagnosed (a read-only directory, a directory in the way).
        let _ = create_private(&path);
        Self::start(path, OpenFlags::default())
    }

    /// Opens the database at `path` only if it exists: neither the file nor its directories
    /// are created, for commands that read runs or change existing ones.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            return Err(Error::Backend(format!("no database at {}", path.display())));
        }
        Self::start(path, OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE)
    }

    fn start(path: PathBuf, flags: OpenFlags) -> Result<Self, Error> {
        let conn = Connection::open_with_flags(&path, flags)
            .map_err(|e| Error::Backend(open_failure(&path, &e)))?;
        // Processes opening one new database at once: switching it to WAL can be refused at
        // once ("database is locked") while another does the same, whatever the busy
        // timeout; try again, a bounded number of times.
        let deadline = std::time::Instant::now() + OPEN_BUSY_WAIT;
        let mut tries = 0;
        loop {
            // Each try waits on the lock no longer than what is left of the one deadline.
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match prepare(&conn, left.max(std::time::Duration::from_millis(10))) {
                Ok(()) => break,
                Err(e)
                    if is_busy(&e)
                        && tries < OPEN_BUSY_TRIES_MAX
                        && std::time::Instant::now() < deadline =>
                {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10 * u64::from(tries)));
                }
                Err(e) => {
                    let tried = if tries > 0 {
                        format!(" (tried {} times)", tries + 1)
                    } else {
                        String::new()
                    };
                    return Err(Error::Backend(format!("{}{tried}", open_failure(&path, &e))));
                }
            }
        }
        // From here on, a writer waits for another's lock up to the usual 10 s.
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| Error::Backend(open_failure(&path, &e)))?;
        // Older databases were moved forward above; one a newer binary wrote is not ours to
        // write (its rows may mean what this binary does not know).
        let found: i64 = conn
            .query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |r| r.get(0))
            .map_err(|e| Error::Backend(open_failure(&path, &e)))?;
        if let Some(refusal) =
            schema::refusal(Backend::Sqlite, &path.display().to_string(), found, "")
        {
            return Err(Error::Backend(refusal));
        }
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let failpoint = Failpoints {
            abort_after: number("BATON_FAILPOINT_ABORT_AFTER_EVENT"),
            abort_after_writes: number("BATON_FAILPOINT_ABORT_AFTER_WRITES"),
            cancel_after: number("BATON_FAILPOINT_CANCEL_AFTER_EVENT"),
            cancel_root_after_writes: number("BATON_FAILPOINT_CANCEL_ROOT_AFTER_WRITES"),
            cancel_before_kind: std::env::var("BATON_FAILPOINT_CANCEL_BEFORE_KIND").ok(),
        };
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Stats::default());
        let counter = Arc::clone(&stats);
        // After each commit SQLite says how many pages the WAL holds: what grew since the
        // last commit (all of it, after the WAL started over) is what this commit wrote.
        let frames = Arc::clone(&stats);
        let mut conn = conn;
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
            let pages = u64::try_from(pages).unwrap_or(0);
            let seen = frames.wal_seen.swap(pages, Ordering::Relaxed);
            let wrote = if pages >= seen { pages - seen } else { pages };
            frames.wal_frames.fetch_add(wrote, Ordering::Relaxed);
            Ok(())
        }))
        .map_err(|e| Error::Backend(open_failure(&path, &e)))?;
        std::thread::Builder::new()
            .name("baton-sqlite".to_owned())
            .spawn(move || serve(conn, &rx, failpoint, &counter))
            .map_err(backend)?;
        let (reads, read_rx) = mpsc::channel();
        let read_rx = Arc::new(std::sync::Mutex::new(read_rx));
        for i in 0..READERS {
            let reader = Connection::open_with_flags(
                &path,
                OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE,
            )
            .and_then(|c| {
                c.busy_timeout(std::time::Duration::from_secs(10))?;
                c.pragma_update(None, "query_only", "ON")?;
                c.pragma_update(None, "cache_size", READER_CACHE_KIB)?;
                plans_by_statement(&c)?;
                Ok(c)
            })
            .map_err(|e| Error::Backend(open_failure(&path, &e)))?;
            let rx = Arc::clone(&read_rx);
            std::thread::Builder::new()
                .name(format!("baton-sqlite-read-{i}"))
                .spawn(move || serve_reads(&reader, &rx))
                .map_err(backend)?;
        }
        let holds = RunHolds::beside(&path);
        Ok(SqliteStore { requests: tx, reads, path, stats, holds })
    }

    /// Transactions committed since the store was opened.
    pub fn commits(&self) -> u64 {
        self.stats.commits.load(Ordering::Relaxed)
    }

    /// Pages this store's commits wrote to the WAL since it was opened.
    pub fn wal_frames(&self) -> u64 {
        self.stats.wal_frames.load(Ordering::Relaxed)
    }

    /// File syncs since the store was opened: one per commit (the WAL, under
    /// `synchronous = FULL`) and two per checkpoint (the WAL and the database file).
    pub fn syncs(&self) -> u64 {
        self.commits() + 2 * self.stats.checkpoints.load(Ordering::Relaxed)
    }

    /// Copies the WAL into the database file and empties it (the file then holds
    /// everything: useful before measuring its size or copying it).
    pub async fn checkpoint(&self) -> Result<(), Error> {
        self.ask(Request::Checkpoint).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A read on a reader connection.
    async fn read<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.reads
            .send(make(reply))
            .map_err(|_| Error::Backend("the SQLite readers have stopped".to_owned()))?;
        answer.await.map_err(|_| Error::Backend("a SQLite reader dropped a request".to_owned()))?
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(make(reply))
            .map_err(|_| Error::Backend("the SQLite thread has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| Error::Backend("the SQLite thread dropped a request".to_owned()))?
    }
}

/// Why the database at `path` could not be opened, in words a user can act on. SQLite
/// says only "unable to open database file"; the operating system's reason is found by
/// looking at the path and trying what SQLite needed (create a file beside it).
fn open_failure(path: &Path, e: &rusqlite::Error) -> String {
    let cannot_open = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly)
    );
    if !cannot_open {
        return format!("{}: {e}", path.display());
    }
    let shown = path.display();
    if path.is_dir() {
        return format!(
            "cannot open the database {shown}: it is a directory; pass the path of a database file"
        );
    }
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => dir.to_path_buf(),
        None => PathBuf::from("."),
    };
    match std::fs::metadata(&dir) {
        Err(io) => {
            return format!(
                "cannot open the database {shown}: its directory {} cannot be used: {io}",
                dir.display()
            );
        }
        Ok(m) if !m.is_dir() => {
            return format!(
                "cannot open the database {shown}: {} is not a directory",
                dir.display()
            );
        }
        Ok(_) => {}
    }
    // SQLite writes its journal (`-wal`, `-shm`) beside the database: the directory must
    // take new files.
    let probe = dir.join(format!(".baton-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(io) if io.kind() != std::io::ErrorKind::AlreadyExists => {
            return format!(
                "cannot open the database {shown}: cannot create files in {}: {io}",
                dir.display()
            );
        }
        Err(_) => {}
    }
    if path.exists()
        && let Err(io) = std::fs::OpenOptions::new().read(true).write(true).open(path)
    {
        return format!("cannot open the database {shown}: {io}");
    }
    format!("cannot open the database {shown}: {e}")
}

/// Creates an empty file at `path`, readable and writable by its user alone, unless
/// something is there already (an empty file is a new SQLite database, and the file
/// `VACUUM INTO` may write into).
fn create_private(path: &Path) -> Result<(), Error> {
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::Backend(format!("cannot create {}: {e}", path.display()))),
    }
}

/// Copies the live database at `src` into a new file `dest` in one step (`VACUUM INTO`):
/// the copy is the database as of one instant, taken through a read transaction of its own,
/// so runs being appended by other connections or processes go on meanwhile (their later
/// commits are not in the copy). SQLite's incremental backup API is not used: it starts
/// over whenever another connection writes, and under steady load may never finish.
///
/// Refuses to overwrite anything at `dest`; a copy that fails half-way is removed.
pub fn backup(src: &Path, dest: &Path) -> Result<(), Error> {
    if !src.is_file() {
        return Err(Error::Backend(format!(
            "no database at {}: give the one to copy with --db",
            src.display()
        )));
    }
    if std::fs::symlink_metadata(dest).is_ok() {
        return Err(Error::Backend(format!(
            "{} already exists; a backup never overwrites a file: name a new one",
            dest.display()
        )));
    }
    let Some(into) = dest.to_str() else {
        return Err(Error::Backend(format!(
            "{} is not a UTF-8 path; name the backup file in UTF-8",
            dest.display()
        )));
    };
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(src, flags)
        .map_err(|e| Error::Backend(format!("cannot open {}: {e}", src.display())))?;
    conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(backend)?;
    // The copy holds every run: its user's alone, like the database.
    create_private(dest)?;
    match conn.execute("VACUUM INTO ?1", [into]) {
        Ok(_) => Ok(()),
        Err(e) => {
            // Only a file this call created can be here (anything before was refused).
            let _ = std::fs::remove_file(dest);
            Err(Error::Backend(format!(
                "cannot copy {} into {}: {e}",
                src.display(),
                dest.display()
            )))
        }
    }
}

/// A statement's plan is made once, from its text, and kept (SQLite's query planner
/// stability guarantee). Without it, a statement whose plan might depend on a bound value
/// (any `column = ?` on an integer column counts, as `rk = ?1` does) is marked expired when
/// its bindings are cleared — which the statement cache does each time it takes one back —
/// and is compiled again at its next step: a quarter of the CPU of reading a log went to
/// compiling the same three statements over and over. Every statement here finds its rows
/// by key, so no plan gains from a bound value.
fn plans_by_statement(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn prepare(conn: &Connection, busy: std::time::Duration) -> rusqlite::Result<()> {
    // First, so that a second process opening the same new database waits for the first
    // (switching to WAL and migrating both lock it) instead of failing at once.
    conn.busy_timeout(busy)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Always, not only while purging: a row moved to another page when a page splits
    // leaves its old copy in the free space it came from, unless freed space is zeroed as
    // it is freed; with it on, a purged log leaves no stale copy behind in the file.
    conn.pragma_update(None, "secure_delete", "ON")?;
    plans_by_statement(conn)?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let current: i64 =
        conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |r| r.get(0))?;
    for (version, _, sql, fill) in schema::sqlite_steps() {
        if version > current {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let applied = (|| {
                // Another process opening the same new database may have applied it
                // between the look above and this lock: look again under it.
                let now: i64 = conn.query_row(
                    "SELECT COALESCE(MAX(version), 0) FROM schema_version",
                    [],
                    |r| r.get(0),
                )?;
                if now >= version {
                    return conn.execute_batch("COMMIT");
                }
                conn.execute_batch(sql)?;
                match fill {
                    Some(SqliteFill::HashExistingRuns) => hash_existing_runs(conn)?,
                    Some(SqliteFill::PackExistingRuns) => pack_existing_runs(conn)?,
                    None => (),
                }
                conn.execute("INSERT INTO schema_version (version) VALUES (?1)", [version])?;
                conn.execute_batch("COMMIT")
            })();
            if applied.is_err() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            applied?;
        }
    }
    Ok(())
}

/// Migration 0003: chains the events of every run already in the database, as they are
/// stored. A run whose chain cannot be computed (a payload that is not JSON) keeps no hash
/// from that event on, so loading it reports the damage.
fn hash_existing_runs(conn: &Connection) -> rusqlite::Result<()> {
    let run_ids: Vec<String> = conn
        .prepare("SELECT run_id FROM runs")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut events = conn.prepare(
        "SELECT seq, at_us, kind, version, level_id, attempt, data FROM events WHERE run_id = ?1 ORDER BY seq",
    )?;
    let mut set_hash =
        conn.prepare("UPDATE events SET hash = ?3 WHERE run_id = ?1 AND seq = ?2")?;
    for run_id in run_ids {
        let mut head = Some(GENESIS);
        let mut rows = events.query([&run_id])?;
        while let Some(r) = rows.next()? {
            let Some(prev) = head else { break };
            let seq: i64 = r.get(0)?;
            let payload: Option<serde_json::Value> =
                r.get::<_, String>(6).ok().and_then(|d| serde_json::from_str(&d).ok());
            let (Some(payload), Ok(seq_u), Ok(version)) =
                (payload, u64::try_from(seq), u16::try_from(r.get::<_, i64>(3)?))
            else {
                head = None;
                break;
            };
            let level_id: Option<String> = r.get(4)?;
            let kind: String = r.get(2)?;
            let hash = chain::link(
                &prev,
                &Fields {
                    seq: seq_u,
                    at_us: r.get(1)?,
                    kind: &kind,
                    version,
                    level_id: level_id.as_deref(),
                    attempt: r.get(5)?,
                    payload: chain::Payload::Json(&payload),
                },
            );
            set_hash.execute(params![run_id, seq, hash.as_slice()])?;
            head = Some(hash);
        }
        drop(rows);
        conn.execute(
            "UPDATE runs SET head_hash = ?2 WHERE run_id = ?1",
            params![run_id, head.as_ref().map(<[u8; 32]>::as_slice)],
        )?;
    }
    Ok(())
}

/// The test failpoints of the module's doc, as the environment set them.
#[derive(Clone, Debug)]
struct Failpoints {
    abort_after: Option<u64>,
    abort_after_writes: Option<u64>,
    cancel_after: Option<u64>,
    cancel_root_after_writes: Option<u64>,
    /// Taken (set to `None`) when it fires: it fires once per process.
    cancel_before_kind: Option<String>,
}

fn serve(
    mut conn: Connection,
    rx: &mpsc::Receiver<Request>,
    mut failpoint: Failpoints,
    stats: &Stats,
) {
    // Events this process has written, for the writes failpoint.
    let mut written = 0u64;
    let mut packer = Packer::default();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let (writes, reads): (Vec<Request>, Vec<Request>) = batch
            .into_iter()
            .partition(|r| matches!(r, Request::Create(..) | Request::Append { .. }));
        let (leases, reads): (Vec<Request>, Vec<Request>) =
            reads.into_iter().partition(|r| matches!(r, Request::Lease(..)));
        if !writes.is_empty() {
            cancel_before_kind(&mut conn, &mut packer, &writes, &mut failpoint.cancel_before_kind);
            decision_barrier(&writes);
            write_group(&mut conn, &mut packer, writes, &failpoint, &mut written);
            let commits = stats.commits.fetch_add(1, Ordering::Relaxed) + 1;
            if commits.is_multiple_of(COMMITS_PER_CHECKPOINT) {
                // A passive checkpoint never blocks readers; what it cannot copy now waits
                // for the next one.
                if conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).is_ok() {
                    stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Lease changes are single statements: each commits on its own, after the appends.
        for r in leases {
            if let Request::Lease(op, reply) = r {
                let _ = reply.send(lease(&conn, op));
            }
        }
        for r in reads {
            if let Request::Checkpoint(reply) = r {
                let done = conn
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .map_err(backend);
                if done.is_ok() {
                    stats.wal_seen.store(0, Ordering::Relaxed);
                }
                let _ = reply.send(done);
                continue;
            }
            read(&conn, packer.dicts(), r);
        }
    }
}

/// A reader thread: takes reads off the shared queue, one at a time, until the store is
/// dropped.
fn serve_reads(conn: &Connection, rx: &std::sync::Mutex<mpsc::Receiver<Request>>) {
    let mut dicts = Dicts::default();
    loop {
        let next = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
        match next {
            Ok(r) => read(conn, &mut dicts, r),
            Err(_) => return,
        }
    }
}

/// The test barrier (`crate::barrier`) before the first append of an outside decision.
fn decision_barrier(writes: &[Request]) {
    for w in writes {
        if let Request::Append { events, .. } = w
            && let Some(dir) = crate::barrier::reached(events)
        {
            crate::barrier::wait_blocking(&dir);
        }
    }
}

/// Test failpoint: `baton cancel` of a job from another process, right before the first
/// append of an event of `kind` to one of its runs commits (which the cancel then makes a
/// conflict). Fires once: `kind` is taken.
fn cancel_before_kind(
    conn: &mut Connection,
    packer: &mut Packer,
    writes: &[Request],
    kind: &mut Option<String>,
) {
    let Some(wanted) = kind.as_deref() else { return };
    let hit = writes.iter().find_map(|w| match w {
        Request::Append { run_id, events, .. }
            if events.iter().any(|e| e.data.kind() == wanted) =>
        {
            Some(run_id.clone())
        }
        _ => None,
    });
    let Some(run_id) = hit else { return };
    *kind = None;
    // Root first, then the rest of its tree, as `baton cancel` of the root writes them.
    let Some((root, _)) = root_of(conn, &run_id) else { return };
    let tree: Vec<(String, String)> = conn
        .prepare(
            "SELECT run_id, status FROM runs WHERE coalesce(root_run_id, run_id) = ?1
              ORDER BY run_id = ?1 DESC, run_id",
        )
        .and_then(|mut q| {
            q.query_map([&root], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()
        })
        .unwrap_or_default();
    for (id, status) in tree {
        if !matches!(status.as_str(), "completed" | "failed" | "aborted" | "cancelled") {
            let _ = cancel_now(conn, packer, &id, &status);
        }
    }
}

/// The job's root of run `run_id` (itself for a root), with its status.
fn root_of(conn: &Connection, run_id: &str) -> Option<(String, String)> {
    conn.query_row(
        "SELECT r.run_id, r.status FROM runs w
           JOIN runs r ON r.run_id = coalesce(w.root_run_id, w.run_id)
          WHERE w.run_id = ?1",
        [run_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .ok()
    .flatten()
}

fn write_group(
    conn: &mut Connection,
    packer: &mut Packer,
    writes: Vec<Request>,
    failpoint: &Failpoints,
    written: &mut u64,
) {
    let begin = |conn: &mut Connection| conn.execute_batch("BEGIN IMMEDIATE").map_err(backend);
    if let Err(e) = begin(conn) {
        for w in writes {
            reply_write(w, Err(e.clone()));
        }
        return;
    }
    // Most groups write without a savepoint per write: a refusal comes before a write
    // changes anything. A write that fails half-way rolls the group back, and the group is
    // written again with a savepoint around each write, so that it fails alone.
    let outcomes = match write_all(conn, packer, &writes, false) {
        Some(outcomes) => Ok(outcomes),
        None => {
            let _ = conn.execute_batch("ROLLBACK");
            packer.reset();
            begin(conn).map(|()| write_all(conn, packer, &writes, true).unwrap_or_default())
        }
    };
    let committed = outcomes
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|_| conn.execute_batch("COMMIT").map_err(backend));
    if committed.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
        // What the packer learnt from this transaction is not in the database.
        packer.reset();
    }
    let outcomes = outcomes.unwrap_or_default();
    let mut highest = 0u64;
    let mut written_here = 0u64;
    // The run whose write crossed the cancel failpoint, with its status.
    let mut crossed: Option<(String, String)> = None;
    // The run whose write made the process's writes cross the root-cancel failpoint.
    let mut crossed_writes: Option<String> = None;
    for (w, outcome) in writes.iter().zip(&outcomes) {
        if outcome.is_err() {
            continue;
        }
        let done = match w {
            Request::Append { run_id, events, status, .. } => {
                Some((run_id.as_str(), events, status.as_str()))
            }
            Request::Create(run, events, _, _) => {
                Some((run.run_id.as_str(), events, run.status.as_str()))
            }
            _ => None,
        };
        if let Some((run_id, events, status)) = done {
            let before = *written + written_here;
            written_here += events.len() as u64;
            if failpoint
                .cancel_root_after_writes
                .is_some_and(|n| before < n && n <= *written + written_here)
            {
                crossed_writes = Some(run_id.to_owned());
            }
            let last = events.last().map_or(0, |e| e.seq);
            highest = highest.max(last);
            let first = events.first().map_or(0, |e| e.seq);
            // A cancel after the end would be refused: the failpoint skips ended runs.
            let ended = matches!(status, "completed" | "failed" | "aborted" | "cancelled");
            if !ended && failpoint.cancel_after.is_some_and(|n| first <= n && n <= last) {
                crossed = Some((run_id.to_owned(), status.to_owned()));
            }
        }
    }
    if committed.is_ok() {
        *written += written_here;
    }
    let writes_crossed = failpoint.abort_after_writes.is_some_and(|n| *written >= n);
    if committed.is_ok() && (failpoint.abort_after.is_some_and(|n| highest >= n) || writes_crossed)
    {
        // Test failpoint: die the way SIGKILL would, right after the commit.
        std::process::abort();
    }
    if committed.is_ok()
        && let Some((run_id, status)) = crossed
    {
        // Test failpoint: another process's cancel, before the writer goes on.
        let _ = cancel_now(conn, packer, &run_id, &status);
    }
    if committed.is_ok()
        && let Some(run_id) = crossed_writes
    {
        // Test failpoint: `baton cancel` of the job's root from another process, right after
        // the commit that made this process's N-th event durable, whichever run it was of.
        if let Some((root, status)) = root_of(conn, &run_id)
            && !matches!(status.as_str(), "completed" | "failed" | "aborted" | "cancelled")
        {
            let _ = cancel_now(conn, packer, &root, &status);
        }
    }
    let mut outcomes = outcomes.into_iter();
    for w in writes {
        let outcome = match (&committed, outcomes.next()) {
            (Err(e), _) => Err(e.clone()),
            (Ok(()), Some(o)) => o,
            (Ok(()), None) => Err(Error::Backend("the write was not attempted".to_owned())),
        };
        reply_write(w, outcome);
    }
}

/// How a write failed: refused before it changed anything, or broken after it began (its
/// changes may be half made).
enum Failure {
    Refused(Error),
    Broken(Error),
}

/// Writes every create and append of a group in the open transaction, in order, each
/// inside a savepoint of its own when `savepoints`; without them, `None` as soon as one
/// breaks half-way (the caller rolls the group back).
fn write_all(
    conn: &Connection,
    packer: &mut Packer,
    writes: &[Request],
    savepoints: bool,
) -> Option<Vec<Result<(), Error>>> {
    let mut outcomes = Vec::with_capacity(writes.len());
    for w in writes {
        if !savepoints {
            match write_one(conn, packer, w) {
                Ok(()) => outcomes.push(Ok(())),
                Err(Failure::Refused(e)) => outcomes.push(Err(e)),
                Err(Failure::Broken(_)) => return None,
            }
            continue;
        }
        if let Err(e) = conn.execute_batch("SAVEPOINT one_write") {
            outcomes.push(Err(backend(e)));
            continue;
        }
        let outcome = match write_one(conn, packer, w) {
            Ok(()) => conn.execute_batch("RELEASE one_write").map_err(backend),
            Err(Failure::Refused(e) | Failure::Broken(e)) => Err(e),
        };
        if outcome.is_err() {
            let _ = conn.execute_batch("ROLLBACK TO one_write; RELEASE one_write");
            packer.reset();
        }
        outcomes.push(outcome);
    }
    Some(outcomes)
}

/// One create or append of a group, in the open transaction.
fn write_one(conn: &Connection, packer: &mut Packer, w: &Request) -> Result<(), Failure> {
    match w {
        Request::Create(run, events, ready, _) => {
            create(conn, run)?;
            if events.is_empty() {
                return Ok(());
            }
            // The run's row is written: from here on a failure is half-way.
            let end = crate::sqlite_log::check_append(conn, &run.run_id, 1, events)
                .map_err(Failure::Broken)?;
            crate::sqlite_log::write_batch(conn, packer, end, events, ready, &run.status)
                .map_err(Failure::Broken)
        }
        Request::Append { run_id, expected, events, ready, status, .. } => {
            let end = crate::sqlite_log::check_append(conn, run_id, *expected, events)
                .map_err(Failure::Refused)?;
            crate::sqlite_log::write_batch(conn, packer, end, events, ready, status)
                .map_err(Failure::Broken)
        }
        _ => Ok(()),
    }
}

/// Appends a `cancel_requested` to a run, as `baton cancel` would (the cancel failpoint).
fn cancel_now(
    conn: &mut Connection,
    packer: &mut Packer,
    run_id: &str,
    status: &str,
) -> Result<(), Error> {
    let tx = conn.transaction().map_err(backend)?;
    let next = crate::sqlite_log::end_of_log(&tx, run_id)?.1.last_seq + 1;
    let cancel = baton_engine::event::NewEvent::run(EventData::CancelRequested(
        baton_engine::event::CancelRequested { by: Some("failpoint".to_owned()), reason: None },
    ))
    .at(next, Utc::now());
    crate::sqlite_log::append(&tx, packer, run_id, next, &[cancel], status)?;
    tx.commit().map_err(|e| {
        packer.reset();
        backend(e)
    })
}

fn reply_write(w: Request, outcome: Result<(), Error>) {
    match w {
        Request::Create(_, _, _, reply) | Request::Append { reply, .. } => {
            let _ = reply.send(outcome);
        }
        _ => {}
    }
}

pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, Error> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| Error::Backend(format!("bad time {s:?}: {e}")))
}

/// `execute` through the connection's statement cache.
fn cached_exec<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Adds a run's record: refused (nothing written) when the run or its key exists.
fn create(conn: &Connection, run: &RunRecord) -> Result<(), Failure> {
    let refused = Failure::Refused;
    let exists: Option<i64> =
        cached_row(conn, "SELECT 1 FROM runs WHERE run_id = ?1", [&run.run_id], |r| r.get(0))
            .optional()
            .map_err(|e| refused(backend(e)))?;
    if exists.is_some() {
        return Err(refused(Error::Exists(run.run_id.clone())));
    }
    // A run names a queue that exists; its due time is worked out from that queue's aging.
    let aging: Option<i64> = cached_row(
        conn,
        "SELECT aging_s FROM queues WHERE name = ?1",
        [&run.placement.queue],
        |r| r.get(0),
    )
    .optional()
    .map_err(|e| refused(backend(e)))?;
    let Some(aging) = aging else {
        return Err(refused(Error::NoQueue(run.placement.queue.clone())));
    };
    let due = baton_engine::store::placement::due(
        run.created_at,
        run.placement.priority,
        u64::try_from(aging).unwrap_or_default(),
    );
    let claim = run.idempotency.as_ref();
    if let Some(claim) = claim {
        let tenant = run.tenant.as_deref();
        if let Some(owner) = run_by_key(conn, tenant, &claim.key).map_err(refused)? {
            return Err(refused(Error::KeyTaken { key: claim.key.clone(), run_id: owner.run_id }));
        }
        // A run whose claim expired lets the key go.
        cached_exec(
            conn,
            "UPDATE runs SET idempotency_key = NULL, key_request = NULL, key_expires_us = NULL
              WHERE COALESCE(tenant, '') = COALESCE(?1, '') AND idempotency_key = ?2",
            params![tenant, claim.key],
        )
        .map_err(|e| Failure::Broken(backend(e)))?;
    }
    cached_exec(conn,
        &format!("INSERT INTO runs (run_id, scenario_id, status, created_at, updated_at, last_seq, head_hash, parent_run_id, root_run_id, idempotency_key, tenant, key_request, key_expires_us, chain, queue, priority, due_us, home, events_version) VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, {})", baton_engine::event::VERSION),
        params![run.run_id, run.scenario_id, run.status, run.created_at.timestamp_micros(), run.updated_at.timestamp_micros(), GENESIS.as_slice(), run.parent_run_id, run.root_run_id, claim.map(|c| &c.key), run.tenant, claim.map(|c| &c.request), claim.map(|c| c.expires_at.timestamp_micros()), chain::Form::Encoded.number(), run.placement.queue, run.placement.priority, due.map(|d| d.timestamp_micros()), run.placement.home],
    )
    .map_err(|e| Failure::Broken(backend(e)))?;
    Ok(())
}

fn lease(conn: &Connection, op: LeaseOp) -> Result<LeaseAnswer, Error> {
    match op {
        LeaseOp::Claim { worker, now, until, queues, home } => {
            // As on PostgreSQL (see its claim), but the writes of every process take turns
            // on SQLite, so the counts under the limits are the committed ones; holds are
            // lock files, which the claimer checks after.
            let row = conn
                .query_row(
                    &format!(
                        "UPDATE runs SET lease_owner = ?1, lease_until_us = ?2 WHERE run_id = (
                            SELECT r.run_id FROM runs r JOIN runs j ON j.run_id = COALESCE(r.root_run_id, r.run_id)
                             WHERE r.status = 'running'
                               AND (r.lease_until_us IS NULL OR r.lease_until_us < ?3)
                               AND (?4 IS NULL OR instr(?4, ',' || j.queue || ',') > 0)
                               AND (j.home IS NULL OR j.home IS ?5) AND j.events_version <= {version}
                               AND NOT EXISTS (SELECT 1 FROM runs o
                                    WHERE o.root_run_id = j.run_id
                                      AND ((o.home IS NOT NULL AND o.home IS NOT ?5)
                                           OR o.events_version > {version}))
                               AND NOT EXISTS (SELECT 1 FROM queues q
                                    WHERE q.name = j.queue AND q.max_running IS NOT NULL
                                      AND q.max_running <= (SELECT count(*) FROM runs x
                                           JOIN runs xj ON xj.run_id = COALESCE(x.root_run_id, x.run_id)
                                           WHERE x.lease_owner IS NOT NULL AND x.status = 'running'
                                             AND x.lease_until_us >= ?3 AND xj.queue = j.queue))
                               AND NOT EXISTS (SELECT 1 FROM tenant_limits t
                                    WHERE t.tenant = j.tenant
                                      AND t.max_running <= (SELECT count(*) FROM runs x
                                           WHERE x.lease_owner IS NOT NULL AND x.status = 'running'
                                             AND x.lease_until_us >= ?3 AND x.tenant = j.tenant))
                             ORDER BY COALESCE(r.due_us, r.created_at), r.run_id LIMIT 1)
                         RETURNING {RUN_COLUMNS}",
                        version = baton_engine::event::VERSION
                    ),
                    params![worker, until, now, queues, home],
                    to_record,
                )
                .optional()
                .map_err(backend)?;
            Ok(LeaseAnswer::Claimed(row.transpose()?.map(|(r, _)| Box::new(r))))
        }
        LeaseOp::Renew { run_id, worker, now, until } => {
            let n = conn
                .execute(
                    "UPDATE runs SET lease_until_us = ?4 WHERE run_id = ?1 AND lease_owner = ?2 AND lease_until_us >= ?3",
                    params![run_id, worker, now, until],
                )
                .map_err(backend)?;
            Ok(LeaseAnswer::Renewed(n == 1))
        }
        LeaseOp::Release { run_id, worker } => {
            conn.execute(
                "UPDATE runs SET lease_owner = NULL, lease_until_us = NULL WHERE run_id = ?1 AND lease_owner = ?2",
                params![run_id, worker],
            )
            .map_err(backend)?;
            Ok(LeaseAnswer::Released)
        }
    }
}

fn read(conn: &Connection, dicts: &mut Dicts, r: Request) {
    match r {
        Request::Load { run_id, after, reply } => {
            let _ = reply.send(load(conn, dicts, &run_id, after));
        }
        Request::Verify { run_id, reply } => {
            let _ = reply.send(verify(conn, dicts, &run_id));
        }
        Request::Run { run_id, reply } => {
            let _ = reply.send(run(conn, &run_id));
        }
        Request::Writers { run_id, reply } => {
            let _ = reply.send(writers(conn, &run_id));
        }
        Request::RunsNamed { ids, reply } => {
            let _ = reply.send(ids.iter().map(|id| run(conn, id)).collect());
        }
        Request::RunByKey { tenant, key, reply } => {
            let _ = reply.send(run_by_key(conn, tenant.as_deref(), &key));
        }
        Request::KeysHeld { tenant, limit, reply } => {
            let _ = reply.send(keys_held(conn, tenant.as_deref(), limit));
        }
        // Each a single statement, committed on its own.
        Request::PutOverride { o, reply } => {
            let written = conn
                .execute(
                    "INSERT INTO tenant_overrides (tenant, scenario_id, yaml, updated_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (tenant, scenario_id) DO UPDATE SET yaml = excluded.yaml, updated_at = excluded.updated_at",
                    params![o.tenant, o.scenario_id, o.yaml, time(o.updated_at)],
                )
                .map(|_| ())
                .map_err(backend);
            let _ = reply.send(written);
        }
        Request::Overrides { tenant, reply } => {
            let _ = reply.send(overrides(conn, tenant.as_deref()));
        }
        Request::RemoveOverride { tenant, scenario_id, reply } => {
            let removed = conn
                .execute(
                    "DELETE FROM tenant_overrides WHERE tenant = ?1 AND scenario_id = ?2",
                    params![tenant, scenario_id],
                )
                .map(|n| n > 0)
                .map_err(backend);
            let _ = reply.send(removed);
        }
        Request::Runs { status, reply } => {
            let _ = reply.send(runs(conn, status.as_deref()));
        }
        Request::RunsPage { query, reply } => {
            let _ = reply.send(runs_page(conn, &query));
        }
        Request::Feed { tenant, after, limit, reply } => {
            let _ = reply.send(crate::sqlite_log::feed(conn, &tenant, after, limit));
        }
        Request::Token(op) => token_op(conn, op),
        Request::Webhook(op) => crate::sqlite_webhooks::webhook_op(conn, op),
        Request::Queue(op) => crate::sqlite_queues::queue_op(conn, op),
        Request::Purge { ids, reply } => {
            let _ = reply.send(purge(conn, &ids));
        }
        Request::PutTexts { checksum, scenario_id, texts, reply } => {
            // One statement, committed on its own; the first copy of a checksum stays.
            let written = conn
                .execute(
                    "INSERT INTO scenario_texts (checksum, scenario_id, texts) VALUES (?1, ?2, ?3)
                     ON CONFLICT (checksum) DO NOTHING",
                    params![checksum, scenario_id, texts],
                )
                .map(|n| n == 1)
                .map_err(|e| {
                    Error::Backend(format!(
                        "cannot keep the texts of scenario `{scenario_id}` version {checksum}: {e}"
                    ))
                });
            let _ = reply.send(written);
        }
        Request::Texts { checksum, reply } => {
            let texts = conn
                .query_row(
                    "SELECT texts FROM scenario_texts WHERE checksum = ?1",
                    [&checksum],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(|e| {
                    Error::Backend(format!(
                        "cannot read the texts of scenario version {checksum}: {e}"
                    ))
                });
            let _ = reply.send(texts);
        }
        _ => {}
    }
}

/// Removes runs and their events in one transaction, their deleted content overwritten
/// (the writer runs with `secure_delete` on) and the write-ahead log emptied after, so
/// that nothing of them stays readable in the files.
fn purge(conn: &Connection, ids: &[String]) -> Result<u64, Error> {
    let removed = (|| {
        let tx = conn.unchecked_transaction().map_err(backend)?;
        let mut removed = 0u64;
        for id in ids {
            cached_exec(
                &tx,
                "DELETE FROM batches WHERE rk = (SELECT rk FROM runs WHERE run_id = ?1)",
                [id],
            )
            .map_err(backend)?;
            removed += cached_exec(&tx, "DELETE FROM runs WHERE run_id = ?1", [id])
                .map_err(backend)? as u64;
        }
        tx.commit().map_err(backend)?;
        Ok(removed)
    })();
    let removed = removed?;
    // Readers elsewhere may keep the log from being emptied now; the next checkpoint does.
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    Ok(removed)
}

fn load(
    conn: &Connection,
    dicts: &mut Dicts,
    run_id: &str,
    after: u64,
) -> Result<Vec<Event>, Error> {
    crate::sqlite_log::load_checked(conn, dicts, run_id, after).map(|(events, _)| events)
}

fn verify(conn: &Connection, dicts: &mut Dicts, run_id: &str) -> Result<Verified, Error> {
    crate::sqlite_log::load_checked(conn, dicts, run_id, 0).map(|(_, verified)| verified)
}

fn run_with_head(
    conn: &Connection,
    run_id: &str,
) -> Result<Option<(RunRecord, Option<Hash>)>, Error> {
    cached_row(
        conn,
        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"),
        [run_id],
        to_record,
    )
    .optional()
    .map_err(backend)?
    .transpose()
}

fn run(conn: &Connection, run_id: &str) -> Result<Option<RunRecord>, Error> {
    Ok(run_with_head(conn, run_id)?.map(|(r, _)| r))
}

/// Each batch's first seq and the writer it recorded, for a run that exists.
fn writers(conn: &Connection, run_id: &str) -> Result<Vec<(u64, String)>, Error> {
    let rk: Option<i64> = conn
        .prepare_cached("SELECT rk FROM runs WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get(0)).optional())
        .map_err(backend)?;
    let rk = rk.ok_or_else(|| Error::NotFound(run_id.to_owned()))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT first_seq, writer FROM batches WHERE rk = ?1 AND writer IS NOT NULL ORDER BY first_seq",
        )
        .map_err(backend)?;
    let rows = stmt
        .query_map([rk], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?)))
        .map_err(backend)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(backend)
}

fn overrides(conn: &Connection, tenant: Option<&str>) -> Result<Vec<TenantOverride>, Error> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, scenario_id, yaml, updated_at FROM tenant_overrides WHERE (?1 IS NULL OR tenant = ?1) ORDER BY tenant, scenario_id",
        )
        .map_err(backend)?;
    let rows = stmt
        .query_map(params![tenant], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (tenant, scenario_id, yaml, at) = row.map_err(backend)?;
        out.push(TenantOverride { tenant, scenario_id, yaml, updated_at: parse_time(&at)? });
    }
    Ok(out)
}

/// The run of `tenant` holding `key` unexpired.
fn run_by_key(
    conn: &Connection,
    tenant: Option<&str>,
    key: &str,
) -> Result<Option<RunRecord>, Error> {
    cached_row(
        conn,
        &format!(
            "SELECT {RUN_COLUMNS} FROM runs
              WHERE COALESCE(tenant, '') = COALESCE(?1, '') AND idempotency_key = ?2
                AND key_expires_us > ?3"
        ),
        params![tenant, key, Utc::now().timestamp_micros()],
        to_record,
    )
    .optional()
    .map_err(backend)?
    .transpose()
    .map(|found| found.map(|(r, _)| r))
}

/// How many keys runs of `tenant` hold unexpired, up to `limit`.
fn keys_held(conn: &Connection, tenant: Option<&str>, limit: u64) -> Result<u64, Error> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let held: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM (SELECT 1 FROM runs
              WHERE COALESCE(tenant, '') = COALESCE(?1, '') AND idempotency_key IS NOT NULL
                AND key_expires_us > ?2 LIMIT ?3)",
        )
        .and_then(|mut s| {
            s.query_row(params![tenant, Utc::now().timestamp_micros(), limit], |r| r.get(0))
        })
        .map_err(backend)?;
    Ok(held.max(0) as u64)
}

/// A page of the run list, newest first after the cursor run (by its creation time, then
/// id, as the list is ordered).
fn runs_page(conn: &Connection, q: &RunQuery) -> Result<Vec<RunRecord>, Error> {
    let (tenant_filtered, tenant) = match &q.tenant {
        Some(t) => (true, t.as_deref()),
        None => (false, None),
    };
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE (?1 = 0 OR tenant IS ?2)
               AND (?3 IS NULL OR status = ?3)
               AND (?4 IS NULL OR scenario_id = ?4)
               AND (?5 = 0 OR parent_run_id IS NULL)
               AND (?6 IS NULL OR (created_at, run_id) <
                    (SELECT created_at, run_id FROM runs WHERE run_id = ?6))
             ORDER BY created_at DESC, run_id DESC LIMIT ?7"
        ))
        .map_err(backend)?;
    let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
    let rows = stmt
        .query_map(
            params![
                tenant_filtered,
                tenant,
                q.status,
                q.scenario_id,
                q.roots_only,
                q.after_run,
                limit
            ],
            to_record,
        )
        .map_err(backend)?;
    rows.map(|r| r.map_err(backend).and_then(|r| r.map(|(r, _)| r))).collect()
}

fn token_op(conn: &Connection, op: TokenOp) {
    const COLUMNS: &str = "id, sha256, tenant, role, name, created_at, revoked_at";
    let read = |r: &Row<'_>| -> rusqlite::Result<Result<TokenRecord, Error>> {
        let (id, sha256, tenant, role, name, created, revoked): (
            String,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
        ) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?);
        let build = || -> Result<TokenRecord, Error> {
            let role = Role::parse(&role).ok_or_else(|| {
                Error::Backend(format!("token {id} has the unknown role {role:?}"))
            })?;
            Ok(TokenRecord {
                id: id.clone(),
                sha256,
                tenant,
                role,
                name,
                created_at: parse_time(&created)?,
                revoked_at: revoked.as_deref().map(parse_time).transpose()?,
            })
        };
        Ok(build())
    };
    match op {
        TokenOp::Put(t, reply) => {
            let put = conn
                .execute(
                    &format!(
                        "INSERT INTO tokens ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)"
                    ),
                    params![t.id, t.sha256, t.tenant, t.role.as_str(), t.name, time(t.created_at)],
                )
                .map(|_| ())
                .map_err(|e| Error::Backend(format!("cannot keep token {}: {e}", t.id)));
            let _ = reply.send(put);
        }
        TokenOp::ByHash(hash, reply) => {
            let found = cached_row(
                conn,
                &format!("SELECT {COLUMNS} FROM tokens WHERE sha256 = ?1"),
                [&hash],
                read,
            )
            .optional()
            .map_err(backend)
            .and_then(Option::transpose);
            let _ = reply.send(found);
        }
        TokenOp::List(tenant, reply) => {
            let list = (|| {
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM tokens WHERE (?1 IS NULL OR tenant = ?1) ORDER BY created_at, id"
                    ))
                    .map_err(backend)?;
                let rows = stmt.query_map(params![tenant], read).map_err(backend)?;
                rows.map(|r| r.map_err(backend).and_then(|r| r)).collect()
            })();
            let _ = reply.send(list);
        }
        TokenOp::Revoke(id, at, reply) => {
            let revoked = conn
                .execute(
                    "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                    params![id, time(at)],
                )
                .map(|n| n == 1)
                .map_err(backend);
            let _ = reply.send(revoked);
        }
        op => session_op(conn, op),
    }
}

/// The session half of [`token_op`].
fn session_op(conn: &Connection, op: TokenOp) {
    const COLUMNS: &str = "sha256, token_sha256, token_id, created_at, seen_at, revoked_at";
    let read = |r: &Row<'_>| -> rusqlite::Result<Result<SessionRecord, Error>> {
        let (sha256, token_sha256, token_id, created, seen, revoked): (
            String,
            String,
            String,
            String,
            String,
            Option<String>,
        ) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?);
        let build = || -> Result<SessionRecord, Error> {
            Ok(SessionRecord {
                sha256,
                token_sha256,
                token_id,
                created_at: parse_time(&created)?,
                seen_at: parse_time(&seen)?,
                revoked_at: revoked.as_deref().map(parse_time).transpose()?,
            })
        };
        Ok(build())
    };
    match op {
        TokenOp::PutSession(s, per_token, forget_before, reply) => {
            let put = (|| -> rusqlite::Result<Vec<String>> {
                let tx = conn.unchecked_transaction()?;
                cached_exec(
                    &tx,
                    "DELETE FROM sessions WHERE created_at < ?1",
                    params![time(forget_before)],
                )?;
                cached_exec(
                    &tx,
                    &format!("INSERT INTO sessions ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, NULL)"),
                    params![
                        s.sha256,
                        s.token_sha256,
                        s.token_id,
                        time(s.created_at),
                        time(s.seen_at)
                    ],
                )?;
                let over: Vec<String> = {
                    let mut stmt = tx.prepare_cached(
                        "SELECT sha256 FROM sessions WHERE token_id = ?1 AND revoked_at IS NULL
                          ORDER BY created_at DESC, sha256 DESC LIMIT -1 OFFSET ?2",
                    )?;
                    let rows = stmt.query_map(
                        params![s.token_id, i64::try_from(per_token).unwrap_or(i64::MAX)],
                        |r| r.get(0),
                    )?;
                    rows.collect::<rusqlite::Result<_>>()?
                };
                for hash in &over {
                    cached_exec(
                        &tx,
                        "UPDATE sessions SET revoked_at = ?2 WHERE sha256 = ?1",
                        params![hash, time(s.created_at)],
                    )?;
                }
                tx.commit()?;
                Ok(over.into_iter().rev().collect())
            })()
            .map_err(|e| Error::Backend(format!("cannot keep a session: {e}")));
            let _ = reply.send(put);
        }
        TokenOp::SessionByHash(hash, reply) => {
            let found = cached_row(
                conn,
                &format!("SELECT {COLUMNS} FROM sessions WHERE sha256 = ?1"),
                [&hash],
                read,
            )
            .optional()
            .map_err(backend)
            .and_then(Option::transpose);
            let _ = reply.send(found);
        }
        TokenOp::TouchSession(hash, at, reply) => {
            let touched = cached_exec(
                conn,
                "UPDATE sessions SET seen_at = ?2 WHERE sha256 = ?1",
                params![hash, time(at)],
            )
            .map(|_| ())
            .map_err(backend);
            let _ = reply.send(touched);
        }
        TokenOp::RevokeSession(hash, at, reply) => {
            let revoked = cached_exec(
                conn,
                "UPDATE sessions SET revoked_at = ?2 WHERE sha256 = ?1 AND revoked_at IS NULL",
                params![hash, time(at)],
            )
            .map(|n| n == 1)
            .map_err(backend);
            let _ = reply.send(revoked);
        }
        TokenOp::Put(..) | TokenOp::ByHash(..) | TokenOp::List(..) | TokenOp::Revoke(..) => {
            token_op(conn, op);
        }
    }
}

fn runs(conn: &Connection, status: Option<&str>) -> Result<Vec<RunRecord>, Error> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE (?1 IS NULL OR status = ?1) ORDER BY created_at DESC, run_id DESC"
        ))
        .map_err(backend)?;
    let rows = stmt.query_map(params![status], to_record).map_err(backend)?;
    rows.map(|r| r.map_err(backend).and_then(|r| r.map(|(r, _)| r))).collect()
}

impl EventStore for SqliteStore {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        // Payloads are made ready here, on the caller's thread, not on the writer's.
        let ready = crate::sqlite_log::ready(&events);
        Box::pin(
            self.ask(move |reply| Request::Create(Box::new(run.clone()), events, ready, reply)),
        )
    }

    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected_seq: u64,
        events: Vec<Event>,
        status: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let ready = crate::sqlite_log::ready(&events);
        Box::pin(self.ask(move |reply| Request::Append {
            run_id: run_id.to_owned(),
            expected: expected_seq,
            events,
            ready,
            status: status.to_owned(),
            reply,
        }))
    }

    fn load<'a>(&'a self, run_id: &'a str, after: u64) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(self.read(move |reply| Request::Load { run_id: run_id.to_owned(), after, reply }))
    }

    fn writers<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, String)>, Error>> {
        Box::pin(self.read(move |reply| Request::Writers { run_id: run_id.to_owned(), reply }))
    }

    fn verify<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Verified, Error>> {
        Box::pin(self.read(move |reply| Request::Verify { run_id: run_id.to_owned(), reply }))
    }

    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(self.read(|reply| Request::Run { run_id: run_id.to_owned(), reply }))
    }

    fn run_by_key<'a>(
        &'a self,
        tenant: Option<&'a str>,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        let (tenant, key) = (tenant.map(str::to_owned), key.to_owned());
        Box::pin(self.read(move |reply| Request::RunByKey { tenant, key, reply }))
    }

    fn keys_held<'a>(
        &'a self,
        tenant: Option<&'a str>,
        limit: u64,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        let tenant = tenant.map(str::to_owned);
        Box::pin(self.read(move |reply| Request::KeysHeld { tenant, limit, reply }))
    }

    fn runs_named<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<RunRecord>>, Error>> {
        Box::pin(self.read(|reply| Request::RunsNamed { ids: ids.to_vec(), reply }))
    }

    fn put_tenant_override<'a>(
        &'a self,
        o: &'a TenantOverride,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.ask(|reply| Request::PutOverride { o: o.clone(), reply }))
    }

    fn tenant_overrides<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TenantOverride>, Error>> {
        Box::pin(
            self.read(move |reply| Request::Overrides { tenant: tenant.map(str::to_owned), reply }),
        )
    }

    fn remove_tenant_override<'a>(
        &'a self,
        tenant: &'a str,
        scenario_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(|reply| Request::RemoveOverride {
            tenant: tenant.to_owned(),
            scenario_id: scenario_id.to_owned(),
            reply,
        }))
    }

    fn put_scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
        scenario_id: &'a str,
        texts: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(|reply| Request::PutTexts {
            checksum: checksum.to_owned(),
            scenario_id: scenario_id.to_owned(),
            texts: texts.to_owned(),
            reply,
        }))
    }

    fn scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(self.read(|reply| Request::Texts { checksum: checksum.to_owned(), reply }))
    }

    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        what: &'a baton_engine::store::Claimable,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let op = LeaseOp::Claim {
                worker: worker.to_owned(),
                now: now.timestamp_micros(),
                until: until.timestamp_micros(),
                queues: (!what.queues.is_empty()).then(|| format!(",{},", what.queues.join(","))),
                home: what.home.clone(),
            };
            match self.ask(move |reply| Request::Lease(op, reply)).await? {
                LeaseAnswer::Claimed(run) => Ok(run.map(|r| *r)),
                _ => Err(Error::Backend("unexpected answer to a claim".to_owned())),
            }
        })
    }

    fn renew<'a>(
        &'a self,
        run_id: &'a str,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let op = LeaseOp::Renew {
                run_id: run_id.to_owned(),
                worker: worker.to_owned(),
                now: now.timestamp_micros(),
                until: until.timestamp_micros(),
            };
            match self.ask(move |reply| Request::Lease(op, reply)).await? {
                LeaseAnswer::Renewed(ok) => Ok(ok),
                _ => Err(Error::Backend("unexpected answer to a renewal".to_owned())),
            }
        })
    }

    fn release<'a>(&'a self, run_id: &'a str, worker: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let op = LeaseOp::Release { run_id: run_id.to_owned(), worker: worker.to_owned() };
            self.ask(move |reply| Request::Lease(op, reply)).await.map(|_| ())
        })
    }

    fn purge<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<u64, Error>> {
        let ids = run_ids.to_vec();
        Box::pin(self.ask(move |reply| Request::Purge { ids, reply }))
    }

    fn runs<'a>(&'a self, status: Option<&'a str>) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        Box::pin(self.read(move |reply| Request::Runs { status: status.map(str::to_owned), reply }))
    }

    fn runs_page<'a>(
        &'a self,
        query: &'a RunQuery,
    ) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        Box::pin(self.read(move |reply| Request::RunsPage { query: query.clone(), reply }))
    }

    fn feed<'a>(
        &'a self,
        tenant: &'a Option<Option<String>>,
        after: FeedCursor,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FeedRef>, Error>> {
        Box::pin(self.read(move |reply| Request::Feed {
            tenant: tenant.clone(),
            after,
            limit,
            reply,
        }))
    }

    /// Whether some process holds the run: its byte of `<database>.holds` is locked. A
    /// look takes no lock.
    fn is_held<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move { self.holds().is_held(run_id) })
    }

    /// An exclusive lock on the run's byte of `<database>.holds` ([`RunHolds`]): the
    /// operating system releases it when the holder closes it or dies, so a crashed driver
    /// never blocks the next one.
    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        Box::pin(async move {
            match self.holds().take(run_id)? {
                Some(hold) => Ok(RunGuard::new(hold)),
                None => Err(Error::Busy(run_id.to_owned())),
            }
        })
    }
}

impl TokenStore for SqliteStore {
    fn put_token<'a>(&'a self, token: &'a TokenRecord) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.ask(move |reply| Request::Token(TokenOp::Put(token.clone(), reply))))
    }

    fn token_by_hash<'a>(
        &'a self,
        sha256: &'a str,
    ) -> BoxFuture<'a, Result<Option<TokenRecord>, Error>> {
        Box::pin(self.read(move |reply| Request::Token(TokenOp::ByHash(sha256.to_owned(), reply))))
    }

    fn tokens<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TokenRecord>, Error>> {
        Box::pin(
            self.read(move |reply| Request::Token(TokenOp::List(tenant.map(str::to_owned), reply))),
        )
    }

    fn revoke_token<'a>(
        &'a self,
        id: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(move |reply| Request::Token(TokenOp::Revoke(id.to_owned(), at, reply))))
    }

    fn put_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        per_token: usize,
        forget_before: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, Error>> {
        Box::pin(self.ask(move |reply| {
            Request::Token(TokenOp::PutSession(
                Box::new(session.clone()),
                per_token,
                forget_before,
                reply,
            ))
        }))
    }

    fn session_by_hash<'a>(
        &'a self,
        sha256: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, Error>> {
        Box::pin(
            self.read(move |reply| {
                Request::Token(TokenOp::SessionByHash(sha256.to_owned(), reply))
            }),
        )
    }

    fn touch_session<'a>(
        &'a self,
        sha256: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(
            self.ask(move |reply| {
                Request::Token(TokenOp::TouchSession(sha256.to_owned(), at, reply))
            }),
        )
    }

    fn revoke_session<'a>(
        &'a self,
        sha256: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(
            self.ask(move |reply| {
                Request::Token(TokenOp::RevokeSession(sha256.to_owned(), at, reply))
            }),
        )
    }
}

impl crate::webhooks::WebhookStore for SqliteStore {
    fn put_webhook<'a>(
        &'a self,
        webhook: &'a crate::webhooks::WebhookRecord,
        per_tenant: usize,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(move |reply| {
            Request::Webhook(WebhookOp::Put(Box::new(webhook.clone()), per_tenant, reply))
        }))
    }

    fn webhook<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::webhooks::WebhookRecord>, Error>> {
        Box::pin(self.read(move |reply| Request::Webhook(WebhookOp::Get(id.to_owned(), reply))))
    }

    fn webhooks(&self) -> BoxFuture<'_, Result<Vec<crate::webhooks::WebhookRecord>, Error>> {
        Box::pin(self.read(move |reply| Request::Webhook(WebhookOp::List(reply))))
    }

    fn remove_webhook<'a>(
        &'a self,
        id: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(
            self.ask(move |reply| Request::Webhook(WebhookOp::Remove(id.to_owned(), at, reply))),
        )
    }

    fn rotate_webhook<'a>(
        &'a self,
        id: &'a str,
        secret: &'a str,
        previous_until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(move |reply| {
            Request::Webhook(WebhookOp::Rotate(
                id.to_owned(),
                secret.to_owned(),
                previous_until,
                reply,
            ))
        }))
    }

    fn claim_deliveries<'a>(
        &'a self,
        owner: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<crate::webhooks::Claimed>, Error>> {
        Box::pin(self.ask(move |reply| {
            Request::Webhook(WebhookOp::Claim { owner: owner.to_owned(), now, until, max, reply })
        }))
    }

    fn record_attempt<'a>(
        &'a self,
        owner: &'a str,
        attempt: &'a crate::webhooks::Attempt,
        after: &'a crate::webhooks::AfterAttempt,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(move |reply| {
            Request::Webhook(WebhookOp::Record(
                owner.to_owned(),
                Box::new(attempt.clone()),
                after.clone(),
                reply,
            ))
        }))
    }

    fn deliveries<'a>(
        &'a self,
        webhook_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<crate::webhooks::DeliveryLog>, Error>> {
        Box::pin(self.read(move |reply| {
            Request::Webhook(WebhookOp::Deliveries(webhook_id.to_owned(), limit, reply))
        }))
    }
}

impl crate::queues::QueueStore for SqliteStore {
    fn create_queue<'a>(
        &'a self,
        queue: &'a crate::queues::QueueRecord,
    ) -> BoxFuture<'a, Result<crate::queues::QueueChange, Error>> {
        Box::pin(
            self.ask(move |reply| Request::Queue(QueueOp::Create(Box::new(queue.clone()), reply))),
        )
    }

    fn change_queue<'a>(
        &'a self,
        name: &'a str,
        set: crate::queues::QueueSet,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<crate::queues::QueueRecord>, Error>> {
        Box::pin(
            self.ask(move |reply| Request::Queue(QueueOp::Change(name.to_owned(), set, at, reply))),
        )
    }

    fn queue<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::queues::QueueRecord>, Error>> {
        Box::pin(self.read(move |reply| Request::Queue(QueueOp::Get(name.to_owned(), reply))))
    }

    /// The waiting runs are those whose job no process of this machine holds (the holds
    /// are lock files, checked here).
    fn queue_loads(
        &self,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<Vec<crate::queues::QueueLoad>, Error>> {
        Box::pin(async move {
            let rows = self.read(move |reply| Request::Queue(QueueOp::Loads(now, reply))).await?;
            let holds = self.holds();
            let mut out = Vec::with_capacity(rows.len());
            for (queue, leased, jobs) in rows {
                let mut waiting = 0u64;
                for job in &jobs {
                    if !holds.is_held(job)? {
                        waiting += 1;
                    }
                }
                out.push(crate::queues::QueueLoad { queue, waiting, leased });
            }
            Ok(out)
        })
    }

    fn set_tenant_limit<'a>(
        &'a self,
        tenant: &'a str,
        max_running: Option<u32>,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.ask(move |reply| {
            Request::Queue(QueueOp::SetLimit(tenant.to_owned(), max_running, at, reply))
        }))
    }

    fn tenant_limits(&self) -> BoxFuture<'_, Result<Vec<crate::queues::TenantLimit>, Error>> {
        Box::pin(self.read(move |reply| Request::Queue(QueueOp::Limits(reply))))
    }
}
