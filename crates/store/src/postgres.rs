//! The PostgreSQL store: the same semantics as the SQLite store, for many processes on
//! many machines.
//!
//! Requests go through a pool of connections (deadpool). An append is one transaction: the
//! run's row is locked (`FOR UPDATE`), the end of its log checked against the head hash,
//! then the events are inserted, the run updated and a notification sent in one statement.
//! The appends of a process that holds its runs, on the ends it knows, are written in
//! groups ([`group`]): one statement and one commit for every run of the group, each run
//! checked on its own. A load reads the run and its events in one statement, so one
//! snapshot.
//!
//! Two connections have one owner each. The *hold* connection takes, renews and gives back
//! the holds that say which process drives a run ([`EventStore::hold`]): a row of `holds`
//! naming this process and the hold connection's session, valid for a length of time
//! ([`DEFAULT_HOLD_FOR`]) and renewed every third of it. A hold is taken over once it has
//! run out, or at once when the session that took it is gone (its process died). Each
//! taking counts the run's hold epoch up, and an append made under a hold checks, in its
//! transaction, that the hold is still this process's: a process that stalled past its
//! hold (stopped, swapped out, cut off) appends nothing after another took the run over
//! ([`Error::Fenced`]), and its workspace writes are refused by the guard's fence. The
//! *listen* connection hears `NOTIFY baton_events` from every append, in every process,
//! and wakes whoever waits for that run's events ([`EventStore::wait_for_events`]).
//!
//! The schema is versioned in `schema_version`: a new database is created at this binary's
//! version; one at another version is refused naming both, and `baton migrate` moves an
//! older one forward. The tables live in the connection's `search_path` (a URL's
//! `options=-csearch_path%3Dname` puts them in their own schema).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_engine::cancel::LiveText;
use baton_engine::chain::{self, Check, Form, GENESIS, Hash};
use baton_engine::event::Event;
use baton_engine::model::BoxFuture;
use baton_engine::store::{
    Error, EventStore, FeedCursor, FeedRef, Fence, Placement, RunGuard, RunQuery, RunRecord,
    TenantOverride, Verified, check_numbering,
};
use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_postgres::{AsyncMessage, NoTls, Row};

use crate::schema::{self, Backend};
use crate::tokens::{Role, SessionRecord, TokenRecord, TokenStore};

mod common;
mod group;
mod live;
mod queues;
mod sessions;
mod webhooks;

use common::{
    Batch, CHANNEL, Held, HeldRun, NOW_US, SERVER_DEADLINES, db_error, knows, lock, micros, pg,
    seq_param,
};

/// The version of the schema this binary reads and writes ([`crate::schema`]).
pub fn schema_version() -> i64 {
    schema::version(Backend::Postgres)
}

/// Pieces of answers heard from other processes that a slow follower may fall behind by;
/// past it, it skips to the newest.
const LIVE_HEARD_MAX: usize = 4096;

/// Most connections in the pool (the hold and listen connections aside); they are opened
/// as they are needed.
const POOL_SIZE_MAX: usize = 8;

/// How long a request waits for a pooled connection before it fails.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// How long taking, probing or giving back a hold may wait for the server.
const HOLD_OP_WAIT: Duration = Duration::from_secs(30);

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A waiter for a run's events looks at the run at least this often, notification or not
/// (a notification lost with the listen connection delays it by no more than this).
const WAIT_LOOK_EVERY: Duration = Duration::from_millis(250);

/// How long a hold lasts without a renewal, unless the store is told otherwise.
pub const DEFAULT_HOLD_FOR: Duration = Duration::from_secs(30);

/// The advisory lock that serialises migrations between processes.
const MIGRATION_LOCK: i64 = 0x6261_746f_6e00_0001;

const RUN_COLUMNS: &str = "run_id, scenario_id, status, created_us, updated_us, last_seq, head_hash, parent_run_id, root_run_id, idempotency_key, tenant, key_request, key_expires_us, queue, priority, due_us, home";

/// How many [`RUN_COLUMNS`] there are: the columns a statement returns after them start here.
const RUN_COLUMN_COUNT: usize = crate::stored::column_count(RUN_COLUMNS);

/// A PostgreSQL database holding runs, events, scenario versions, overrides and tokens.
pub struct PostgresStore {
    pool: Pool,
    /// The URL without its password, for messages.
    shown: String,
    holds: mpsc::UnboundedSender<HoldOp>,
    /// The runs this process holds.
    held: Held,
    /// This process's name in `holds` (random, one per store).
    holder: String,
    hold_for: Duration,
    /// The hold connection's session (its backend's pid and start): it lives as long as
    /// this process, and names the process in its leases on runs.
    session: (i32, std::time::SystemTime),
    /// Write transactions committed (creates, appends and the holds' takes, renewals and
    /// give-backs), for the bench.
    commits: Arc<std::sync::atomic::AtomicU64>,
    /// The queue of appends on known ends, written in groups ([`group`]).
    appends: mpsc::UnboundedSender<group::Queued>,
    waiters: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    /// The listen connection's client, made at the first wait for events (a command that
    /// never waits never opens it): while it lives, its LISTEN stays in force.
    listening: tokio::sync::OnceCell<tokio_postgres::Client>,
    /// Set once the listen connection listens for pieces of answers, named in
    /// `live_listeners` ([`live::LISTENER`]).
    live_listening: tokio::sync::OnceCell<()>,
    /// The pieces of answers other processes publish, as the listen connection hears them.
    live_in: tokio::sync::broadcast::Sender<LiveText>,
    /// The publisher of this process's pieces ([`live`]), started at the first one.
    live_out: std::sync::OnceLock<mpsc::Sender<LiveText>>,
    config: tokio_postgres::Config,
    growth: Growth,
}

/// The fewest runs at which this process first analyzes the tables it grows.
const ANALYZE_FIRST_AT: u64 = 1024;

/// Keeps PostgreSQL's picture of the tables' sizes current while this process grows them.
///
/// Statements are planned once per connection, against the sizes the server knows then,
/// and the plan is kept until the table is analyzed again — which autovacuum does a minute
/// or more after a new table fills. A plan made while `runs` was nearly empty finds rows by
/// scanning it (cheaper, for a few pages), and goes on scanning it once it holds thousands
/// of runs. So every time the runs this process created take the table past twice its size
/// when last analyzed, the process analyzes the store's tables itself, in the background:
/// a logarithmic number of times (10 by a million runs), each replanning every
/// connection's statements. Only `runs` and `holds`: every statement finds events by their
/// run's key, and sampling the events table (wide rows) cost half a second of the server's
/// CPU each time at 200 000 events.
#[derive(Debug)]
struct Growth {
    /// Runs in the table by the server's last estimate, plus those created since.
    runs: std::sync::atomic::AtomicU64,
    /// At how many runs to analyze next.
    next: std::sync::atomic::AtomicU64,
}

impl Growth {
    async fn read(pool: &Pool) -> Result<Growth, Error> {
        let c = pool.get().await.map_err(backend)?;
        let row = c
            .query_one(
                "SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = 'runs'::regclass",
                &[],
            )
            .await
            .map_err(pg)?;
        let runs = u64::try_from(row.try_get::<_, i64>(0).map_err(pg)?).unwrap_or(0);
        Ok(Growth { runs: runs.into(), next: runs.saturating_mul(2).max(ANALYZE_FIRST_AT).into() })
    }

    /// Counts a created run; analyzes once the table has doubled.
    fn created(&self, pool: &Pool) {
        use std::sync::atomic::Ordering::Relaxed;
        let runs = self.runs.fetch_add(1, Relaxed) + 1;
        let next = self.next.load(Relaxed);
        if runs < next
            || self.next.compare_exchange(next, runs.saturating_mul(2), Relaxed, Relaxed).is_err()
        {
            return;
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            // Statistics only: a failure (another process analyzing, a role that does not own
            // the tables) leaves the plans as they were, and autovacuum catches up later.
            if let Ok(c) = pool.get().await {
                let _ = c.batch_execute("ANALYZE runs, holds").await;
            }
        });
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").field("db", &self.shown).finish_non_exhaustive()
    }
}

/// What the hold connection's owner is asked to do.
enum HoldOp {
    /// Take the run's hold; its epoch when taken, none when another process holds it.
    Take(String, oneshot::Sender<Result<Option<i64>, Error>>),
    /// Whether any process holds the run.
    Probe(String, oneshot::Sender<Result<bool, Error>>),
}

/// Whether a `--db` value names a PostgreSQL database.
pub fn is_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// The URL as it may be shown: without its password.
pub fn shown(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Backend(e.to_string())
}

fn from_micros(us: i64, what: &str) -> Result<DateTime<Utc>, String> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| format!("column `{what}` holds {us}, not a time"))
}

/// What a migration check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaState {
    /// No Baton tables yet.
    Empty,
    /// At this version.
    At(i64),
}

impl PostgresStore {
    /// Connects to the database at `url`; a database without Baton's tables gets them, one
    /// at another version than this binary's is refused (`baton migrate` moves it forward).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, DEFAULT_HOLD_FOR).await
    }

    /// [`PostgresStore::connect`], its holds lasting `hold_for` without a renewal (a killed
    /// or stalled driver's runs are taken over after it; at least 3 s).
    pub async fn connect_holding(url: &str, hold_for: Duration) -> Result<Self, Error> {
        Self::connect_with(url, hold_for.max(Duration::from_secs(3))).await
    }

    /// Connects and applies every migration the database lacks: `baton migrate`.
    pub async fn migrate(url: &str) -> Result<(i64, i64), Error> {
        let config = config(url)?;
        let (mut client, _task) = connect_one(&config, url).await?;
        let from = match prepare_schema(&mut client, true).await? {
            SchemaState::Empty => 0,
            SchemaState::At(v) if v > schema_version() => {
                let refusal = schema::refusal(Backend::Postgres, &shown(url), v, "");
                return Err(Error::Backend(refusal.unwrap_or_default()));
            }
            SchemaState::At(v) => v,
        };
        Ok((from, schema_version()))
    }

    async fn connect_with(url: &str, hold_for: Duration) -> Result<Self, Error> {
        let shown_url = shown(url);
        let config = config(url)?;
        let (mut client, _task) = connect_one(&config, url).await?;
        if let SchemaState::At(v) = prepare_schema(&mut client, false).await? {
            let migrate = format!("run `baton migrate --db {shown_url}` (it keeps every run)");
            if let Some(refusal) = schema::refusal(Backend::Postgres, &shown_url, v, &migrate) {
                return Err(Error::Backend(refusal));
            }
        }
        drop(client);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE_MAX)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(backend)?;
        let (hold_client, _) = connect_one(&config, url).await?;
        let session = hold_client
            .query_one(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .map_err(pg)?;
        let session = (
            session.try_get::<_, i32>(0).map_err(pg)?,
            session.try_get::<_, std::time::SystemTime>(1).map_err(pg)?,
        );
        let (holds, rx) = mpsc::unbounded_channel();
        let holder = format!("{}-{}", std::process::id(), uuid_like());
        let held: Held = Arc::default();
        let statements = HoldStatements::prepare(&hold_client).await?;
        let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(own_holds(
            HoldOwner {
                client: hold_client,
                statements,
                held: Arc::clone(&held),
                holder: holder.clone(),
                session,
                hold_for,
                commits: Arc::clone(&commits),
            },
            rx,
        ));
        let growth = Growth::read(&pool).await?;
        let appends = group::start(
            pool.clone(),
            group::Holder {
                name: holder.clone(),
                session,
                hold_us: i64::try_from(hold_for.as_micros()).unwrap_or(i64::MAX),
            },
            Arc::clone(&held),
            Arc::clone(&commits),
        );
        Ok(PostgresStore {
            pool,
            shown: shown_url,
            holds,
            held,
            holder,
            hold_for,
            session,
            commits,
            appends,
            waiters: Arc::default(),
            listening: tokio::sync::OnceCell::new(),
            live_in: tokio::sync::broadcast::channel(LIVE_HEARD_MAX).0,
            live_out: std::sync::OnceLock::new(),
            live_listening: tokio::sync::OnceCell::new(),
            config,
            growth,
        })
    }

    /// Opens the listen connection (at the first wait, notifier or live follower).
    async fn listen(&self) -> Result<tokio_postgres::Client, Error> {
        listen(&self.config, &self.shown, Arc::clone(&self.waiters), self.live_in.clone()).await
    }

    /// The URL of the database, without its password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Write transactions this store has committed: creates, appends, and the takes,
    /// renewals and give-backs of its holds.
    pub fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What the runs, their events and holds take in the database, in bytes (tables and
    /// their indexes).
    pub async fn bytes(&self) -> Result<u64, Error> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT (pg_total_relation_size('runs') + pg_total_relation_size('events') + pg_total_relation_size('holds'))::bigint",
                &[],
            )
            .await
            .map_err(pg)?;
        Ok(u64::try_from(row.try_get::<_, i64>(0).map_err(pg)?).unwrap_or(0))
    }

    /// A setting as this store's connections run under it (`synchronous_commit`, printed
    /// beside durable figures; the deadlines), as the server shows it.
    pub async fn setting(&self, name: &str) -> Result<String, Error> {
        let c = self.client().await?;
        let row = c.query_one("SELECT current_setting($1)", &[&name]).await.map_err(pg)?;
        row.try_get(0).map_err(pg)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.pool
            .get()
            .await
            .map_err(|e| Error::Backend(format!("postgres {}: no connection: {e}", self.shown)))
    }

    async fn hold_op<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> HoldOp,
    ) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        let lost = || {
            Error::Backend(format!(
                "postgres {}: the connection that keeps this process's holds on runs was lost; restart the process (its runs are taken over once their holds run out)",
                self.shown
            ))
        };
        self.holds.send(make(tx)).map_err(|_| lost())?;
        match tokio::time::timeout(HOLD_OP_WAIT, rx).await {
            Ok(answer) => answer.map_err(|_| lost())?,
            Err(_) => Err(Error::Backend(format!(
                "postgres {}: no answer about a run's hold within {} s; check the server (a run held before stays held until its hold runs out)",
                self.shown,
                HOLD_OP_WAIT.as_secs()
            ))),
        }
    }
}

fn config(url: &str) -> Result<tokio_postgres::Config, Error> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
        Error::Backend(format!(
            "--db {}: not a PostgreSQL URL ({e}); write postgres://USER@HOST:PORT/DATABASE",
            shown(url)
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("baton");
    }
    // Every statement Baton prepares finds its rows by key: the generic plan is the right
    // one, and planning each execution anew (PostgreSQL's custom plans for array
    // parameters) costs more than the execution. And it stays by key: a plan made while a
    // table is nearly empty (a generic plan is made once per connection) would otherwise
    // scan it instead — the group statement's update of `runs` read every run of the
    // table on every group, 0.4 ms a group at 3 000 runs, growing with the table. A
    // setting in the URL's options wins.
    let mut options = config.get_options().unwrap_or_default().to_owned();
    if !options.contains("plan_cache_mode") {
        options.push_str(" -c plan_cache_mode=force_generic_plan");
    }
    if !options.contains("enable_seqscan") {
        options.push_str(" -c enable_seqscan=off");
    }
    for (setting, value) in SERVER_DEADLINES {
        if !options.contains(setting) {
            options.push_str(&format!(" -c {setting}={value}"));
        }
    }
    // Every batch this process appends names it ([`baton_engine::store::writer`]).
    let mut writer = String::new();
    for c in baton_engine::store::writer().chars().filter(|c| !c.is_control()) {
        if c == ' ' || c == '\\' {
            writer.push('\\');
        }
        writer.push(c);
    }
    options.push_str(&format!(" -c baton.writer={writer}"));
    config.options(options.trim());
    Ok(config)
}

/// One connection of our own, its connection task spawned.
async fn connect_one(
    config: &tokio_postgres::Config,
    url: &str,
) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), Error> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| {
        Error::Backend(format!(
            "cannot connect to the PostgreSQL database {}: {}; check that the server runs and the URL's user, host, port and database",
            shown(url),
            db_error(&e)
        ))
    })?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// Looks at the database's schema version and moves it forward — every missing migration
/// when `forward`, else only a database without Baton's tables — in one transaction under
/// an advisory lock: another process preparing the same database at the same moment waits,
/// then finds the work done (never a database half way). The version found before.
async fn prepare_schema(
    client: &mut tokio_postgres::Client,
    forward: bool,
) -> Result<SchemaState, Error> {
    let tx = client.transaction().await.map_err(pg)?;
    if forward {
        // `baton migrate` moves every run the database holds: as long as that takes.
        tx.batch_execute("SET LOCAL statement_timeout = 0").await.map_err(pg)?;
    }
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(pg)?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
        .await
        .map_err(pg)?
        .get(0);
    let found = if exists {
        let v: Option<i64> = tx
            .query_one("SELECT MAX(version)::bigint FROM schema_version", &[])
            .await
            .map_err(pg)?
            .get(0);
        SchemaState::At(v.unwrap_or(0))
    } else {
        SchemaState::Empty
    };
    let from = match found {
        SchemaState::Empty => 0,
        SchemaState::At(v) if forward => v,
        SchemaState::At(_) => return Ok(found),
    };
    if from == 0 {
        tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
            .await
            .map_err(pg)?;
    }
    for (version, _, sql) in schema::postgres_steps() {
        if version <= from {
            continue;
        }
        tx.batch_execute(sql)
            .await
            .map_err(|e| Error::Backend(format!("migration {version}: {}", db_error(&e))))?;
        tx.execute("INSERT INTO schema_version (version) VALUES ($1)", &[&version])
            .await
            .map_err(pg)?;
    }
    tx.commit().await.map_err(pg)?;
    Ok(found)
}

/// Whether the session that took the hold `h` still lives (its process has not died).
pub(super) const HOLDER_ALIVE: &str = "EXISTS (SELECT 1 FROM pg_stat_activity a
    WHERE a.pid = h.holder_pid AND a.backend_start = h.holder_since)";

/// The hold connection's statements, prepared once.
struct HoldStatements {
    take: tokio_postgres::Statement,
    probe: tokio_postgres::Statement,
    renew: tokio_postgres::Statement,
}

impl HoldStatements {
    async fn prepare(client: &tokio_postgres::Client) -> Result<HoldStatements, Error> {
        // A taking names the hold connection's own session (`$4`, `$5`), which lives as
        // long as the process.
        let take = format!(
            "INSERT INTO holds AS h (run_id, holder, holder_pid, holder_since, until_us, epoch)
             VALUES ($1, $2, $4, $5, {NOW_US} + $3, 1)
             ON CONFLICT (run_id) DO UPDATE SET holder = EXCLUDED.holder,
               holder_pid = EXCLUDED.holder_pid, holder_since = EXCLUDED.holder_since,
               until_us = EXCLUDED.until_us, epoch = h.epoch + 1
             WHERE h.until_us < {NOW_US} OR NOT {HOLDER_ALIVE} OR h.holder = $2
             RETURNING epoch"
        );
        let probe = format!(
            "SELECT EXISTS (SELECT 1 FROM holds h
               WHERE h.run_id = $1 AND h.holder <> $2 AND h.until_us >= {NOW_US}
                 AND {HOLDER_ALIVE})"
        );
        let renew = format!(
            "UPDATE holds SET until_us = {NOW_US} + $2 WHERE holder = $1 AND run_id = ANY($3) RETURNING run_id"
        );
        Ok(HoldStatements {
            take: client.prepare(&take).await.map_err(pg)?,
            probe: client.prepare(&probe).await.map_err(pg)?,
            renew: client.prepare(&renew).await.map_err(pg)?,
        })
    }
}

/// What the owner of the hold connection works with.
struct HoldOwner {
    client: tokio_postgres::Client,
    statements: HoldStatements,
    held: Held,
    holder: String,
    session: (i32, std::time::SystemTime),
    hold_for: Duration,
    /// The store's count of write transactions, which the holds' statements add to.
    commits: Arc<std::sync::atomic::AtomicU64>,
}

/// The owner of the hold connection: takes, gives back and probes holds in the order they
/// are asked for, and renews every hold of this process every third of their length. A
/// renewal that finds a hold no longer this process's marks it lost at once. When the
/// connection is lost, the owner stops: every later request fails, and the holds run out.
async fn own_holds(owner: HoldOwner, mut rx: mpsc::UnboundedReceiver<HoldOp>) {
    let HoldOwner { client, statements, held, holder, session, hold_for, commits } = owner;
    // Every statement that wrote (a hold taken, renewed or given back) is a commit.
    let wrote = |rows: u64| {
        if rows > 0 {
            commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let hold_us = i64::try_from(hold_for.as_micros()).unwrap_or(i64::MAX);
    let HoldStatements { take, probe, renew } = statements;
    let mut every = tokio::time::interval(hold_for / 3);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let op = tokio::select! {
            op = rx.recv() => match op {
                Some(op) => op,
                None => return,
            },
            _ = every.tick() => {
                let ids: Vec<String> = lock(&held).keys().cloned().collect();
                if ids.is_empty() {
                    continue;
                }
                let sent = std::time::Instant::now();
                match client.query(&renew, &[&holder, &hold_us, &ids]).await {
                    Ok(rows) => {
                        wrote(rows.len() as u64);
                        let kept: HashSet<String> = rows.iter().filter_map(|r| r.try_get(0).ok()).collect();
                        for (id, run) in lock(&held).iter() {
                            let mut until = lock(&run.valid_until);
                            // A new run's hold has no row until the run is made; no one
                            // else can take it before.
                            if kept.contains(id) || run.pending {
                                *until = sent + hold_for;
                            } else if run.epoch != 0 {
                                *until = sent;
                            }
                        }
                    }
                    Err(_) if client.is_closed() => return,
                    Err(_) => {}
                }
                continue;
            }
        };
        match op {
            HoldOp::Take(run_id, reply) => {
                let got = client
                    .query(&take, &[&run_id, &holder, &hold_us, &session.0, &session.1])
                    .await
                    .map(|rows| {
                        wrote(rows.len() as u64);
                        rows.first().map(|r| r.get::<_, i64>(0))
                    })
                    .map_err(pg);
                let closed = got.is_err() && client.is_closed();
                let _ = reply.send(got);
                if closed {
                    return;
                }
            }
            HoldOp::Probe(run_id, reply) => {
                let found = client
                    .query_one(&probe, &[&run_id, &holder])
                    .await
                    .map(|r| r.get::<_, bool>(0))
                    .map_err(pg);
                let _ = reply.send(found);
            }
        }
    }
}

/// Starts the listen connection: every notification on [`CHANNEL`] wakes the waiters of the
/// run it names. When the connection is lost, waiters fall back to looking every
/// [`WAIT_LOOK_EVERY`]. The client returned must be kept for the LISTEN to last.
async fn listen(
    config: &tokio_postgres::Config,
    url: &str,
    waiters: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    live_in: tokio::sync::broadcast::Sender<LiveText>,
) -> Result<tokio_postgres::Client, Error> {
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| {
        Error::Backend(format!("cannot connect to {} to listen: {}", shown(url), db_error(&e)))
    })?;
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) if n.channel() == live::LIVE_CHANNEL => {
                    // Nobody following is no error.
                    if let Some(piece) = live::parse(n.payload()) {
                        let _ = live_in.send(piece);
                    }
                }
                Ok(AsyncMessage::Notification(n)) => {
                    let woken = lock(&waiters).get(n.payload()).cloned();
                    if let Some(notify) = woken {
                        notify.notify_waiters();
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    // Pieces of answers are listened for only by a process that relays them
    // ([`live::LISTENER`]).
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await.map_err(pg)?;
    Ok(client)
}

/// A run's record from the first columns of a row ([`RUN_COLUMNS`]), with its head hash.
fn to_record(r: &Row) -> Result<(RunRecord, Option<Hash>), Error> {
    let run_id: String = r.try_get(0).map_err(pg)?;
    let fail = |p: String| Error::Damaged {
        run_id: run_id.clone(),
        seq: 1,
        problem: format!("the run's record: {p}"),
    };
    let read = || -> Result<(RunRecord, Option<Hash>), String> {
        let col = |e: tokio_postgres::Error| e.to_string();
        let last_seq: i64 = r.try_get(5).map_err(col)?;
        let head: Option<Vec<u8>> = r.try_get(6).map_err(col)?;
        Ok((
            RunRecord {
                run_id: run_id.clone(),
                scenario_id: r.try_get(1).map_err(col)?,
                status: r.try_get(2).map_err(col)?,
                created_at: from_micros(r.try_get(3).map_err(col)?, "created_us")?,
                updated_at: from_micros(r.try_get(4).map_err(col)?, "updated_us")?,
                last_seq: u64::try_from(last_seq)
                    .map_err(|_| format!("column `last_seq` holds {last_seq}, not a count"))?,
                parent_run_id: r.try_get(7).map_err(col)?,
                root_run_id: r.try_get(8).map_err(col)?,
                tenant: r.try_get(10).map_err(col)?,
                idempotency: crate::stored::key_claim(
                    r.try_get(9).map_err(col)?,
                    r.try_get(11).map_err(col)?,
                    r.try_get(12).map_err(col)?,
                )?,
                placement: Placement {
                    queue: r.try_get(13).map_err(col)?,
                    priority: r.try_get(14).map_err(col)?,
                    due_at: r
                        .try_get::<_, Option<i64>>(15)
                        .map_err(col)?
                        .map(|us| from_micros(us, "due_us"))
                        .transpose()?,
                    home: r.try_get(16).map_err(col)?,
                },
            },
            head.as_deref().and_then(chain::from_bytes),
        ))
    };
    read().map_err(fail)
}

fn records(rows: &[Row]) -> Result<Vec<RunRecord>, Error> {
    rows.iter().map(|r| to_record(r).map(|(r, _)| r)).collect()
}

type Client = deadpool_postgres::ClientWrapper;

async fn query(
    c: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Row>, Error> {
    let stmt = c.prepare_cached(sql).await.map_err(pg)?;
    c.query(&stmt, params).await.map_err(pg)
}

/// The unique index a refused insert broke, if that is why it was refused.
fn unique_violation(e: &tokio_postgres::Error) -> Option<String> {
    let d = e.as_db_error()?;
    (d.code() == &tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
        .then(|| d.constraint().unwrap_or_default().to_owned())
}

/// Creates a run with its first events in one statement (its own transaction): the run's
/// row, its events and a notification — only while this process's hold on it (when it
/// holds it) is still its own. The run's end.
async fn create(
    c: &Client,
    run: &RunRecord,
    events: &[Event],
    fence: Option<(&str, i64)>,
) -> Result<Verified, Error> {
    check_numbering(events, 1)?;
    let b = Batch::new(events, Verified::fresh());
    let stmt = c
        .prepare_cached(&format!(
            "WITH held AS (
               SELECT 1 FROM holds WHERE run_id = $1 AND holder = $20 AND epoch = $21 FOR SHARE
             ), run AS (
               INSERT INTO runs (run_id, scenario_id, status, created_us, updated_us, last_seq, head_hash, parent_run_id, root_run_id, idempotency_key, tenant, key_request, key_expires_us, chain, queue, priority, due_us, home, events_version)
               SELECT $1, $14, $11, $15, $12, $10, $13, $16, $17, $18, $19, $22, $23, 2, $24, $25, $26, $27, {}
                WHERE $20::text IS NULL OR EXISTS (SELECT 1 FROM held)
               RETURNING run_id
             ), inserted AS ({BATCH_INSERT} WHERE EXISTS (SELECT 1 FROM run))
             SELECT pg_notify('baton_events', run_id) FROM run",
            baton_engine::event::VERSION
        ))
        .await
        .map_err(pg)?;
    let status = run.status.as_str();
    let run_id = run.run_id.as_str();
    let mut params = b.params(&run_id, &status);
    // Updated when its last event happened (when it was made, without events).
    let updated = if events.is_empty() { micros(run.updated_at) } else { b.updated_us };
    params[11] = &updated;
    let created = micros(run.created_at);
    let (holder, epoch) = fence.map_or((None, None), |(h, e)| (Some(h), Some(e)));
    let claim = run.idempotency.as_ref();
    let (key, request) = (claim.map(|c| &c.key), claim.map(|c| &c.request));
    let expires = claim.map(|c| micros(c.expires_at));
    // A run names a queue that exists (queues are never removed); its due time is worked
    // out from that queue's aging.
    let aging: Option<i64> = c
        .query_opt("SELECT aging_s FROM queues WHERE name = $1", &[&run.placement.queue])
        .await
        .map_err(pg)?
        .map(|r| r.get(0));
    let Some(aging) = aging else {
        return Err(Error::NoQueue(run.placement.queue.clone()));
    };
    let due = baton_engine::store::placement::due(
        run.created_at,
        run.placement.priority,
        u64::try_from(aging).unwrap_or_default(),
    )
    .map(micros);
    params.extend_from_slice(&[
        &run.scenario_id,
        &created,
        &run.parent_run_id,
        &run.root_run_id,
        &key,
        &run.tenant,
        &holder,
        &epoch,
        &request,
        &expires,
        &run.placement.queue,
        &run.placement.priority,
        &due,
        &run.placement.home,
    ]);
    match c.query(&stmt, &params).await {
        Ok(rows) if rows.is_empty() => Err(Error::Fenced(run.run_id.clone())),
        Ok(_) => Ok(b.end()),
        Err(e) => Err(match unique_violation(&e).as_deref() {
            Some("runs_pkey") => Error::Exists(run.run_id.clone()),
            Some("runs_by_idempotency_key") => Error::KeyTaken {
                key: run.idempotency.as_ref().map(|c| c.key.clone()).unwrap_or_default(),
                run_id: "another run".to_owned(),
            },
            _ => pg(e),
        }),
    }
}

/// The end of a run's log as an append builds on it, the run's row locked until the
/// transaction ends: its `last_seq` and head hash, checked against the stored hash of that
/// last event.
async fn end_of_log(
    tx: &deadpool_postgres::Transaction<'_>,
    run_id: &str,
    fence: Option<(&str, i64)>,
) -> Result<Verified, Error> {
    // Two statements, sent together: the first locks the run's row (waiting for another
    // append to end), the second — its own snapshot, taken once the lock is held — reads
    // the stored hash of the last event. In one statement, a row locked after a wait would
    // be joined with the events of the snapshot from before it.
    let head_sql = "SELECT last_seq, head_hash, chain FROM runs WHERE run_id = $1 FOR UPDATE";
    let last_sql = "SELECT hash FROM events
          WHERE run_id = $1 AND seq = (SELECT last_seq FROM runs WHERE run_id = $1)";
    let hold_sql = "SELECT holder, epoch FROM holds WHERE run_id = $1 FOR SHARE";
    let (head_stmt, last_stmt, hold_stmt) = tokio::try_join!(
        tx.prepare_cached(head_sql),
        tx.prepare_cached(last_sql),
        tx.prepare_cached(hold_sql)
    )
    .map_err(pg)?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&run_id];
    // An append under this process's hold checks that the hold is still its own, the
    // hold's row kept from changing hands until the append commits.
    // Every answer is awaited and the first statement's error wins: once one fails (a lock
    // deadline, say), the server answers the later ones only "the transaction is aborted".
    let (rows, last_rows, hold_rows) = match fence {
        Some(_) => tokio::join!(
            tx.query(&head_stmt, &params),
            tx.query(&last_stmt, &params),
            tx.query(&hold_stmt, &params)
        ),
        None => {
            let (a, b) = tokio::join!(tx.query(&head_stmt, &params), tx.query(&last_stmt, &params));
            (a, b, Ok(Vec::new()))
        }
    };
    let (rows, last_rows, hold_rows) =
        (rows.map_err(pg)?, last_rows.map_err(pg)?, hold_rows.map_err(pg)?);
    if let Some((holder, epoch)) = fence {
        let still = hold_rows.first().is_some_and(|r| {
            r.try_get::<_, String>(0).is_ok_and(|h| h == holder)
                && r.try_get::<_, i64>(1).is_ok_and(|e| e == epoch)
        });
        if !still {
            return Err(Error::Fenced(run_id.to_owned()));
        }
    }
    let Some(row) = rows.first() else { return Err(Error::NotFound(run_id.to_owned())) };
    let damaged =
        |seq: u64, problem: String| Error::Damaged { run_id: run_id.to_owned(), seq, problem };
    let last: i64 = row.try_get(0).map_err(pg)?;
    let last = u64::try_from(last)
        .map_err(|_| damaged(1, format!("the run's record says it has {last} events")))?;
    let head: Option<Vec<u8>> = row.try_get(1).map_err(pg)?;
    let head = head.as_deref().and_then(chain::from_bytes).ok_or_else(|| {
        damaged(last + 1, "the run's record has no head hash (or not a 32-byte one)".to_owned())
    })?;
    let form: i16 = row.try_get(2).map_err(pg)?;
    let form = Form::from_number(form.into()).ok_or_else(|| Form::unknown(run_id, form.into()))?;
    let found = last_rows.first();
    let stored_hash: Option<Vec<u8>> =
        found.map(|r| r.try_get(0)).transpose().map_err(pg)?.flatten();
    let found = found.is_some();
    let stored: Option<Hash> = if last == 0 {
        Some(GENESIS)
    } else if found {
        Some(stored_hash.as_deref().and_then(chain::from_bytes).unwrap_or([0xff; 32]))
    } else {
        None
    };
    match stored {
        None => Err(damaged(last, format!("the event is missing: the run records {last} events"))),
        Some(h) if h != head => Err(damaged(
            last + 1,
            format!(
                "the run's head hash does not match event {last}: events after it were lost or the run's record was changed"
            ),
        )),
        Some(_) => Ok(Verified { last_seq: last, head, form }),
    }
}

/// The columns of a batch and the run's new end, parameters `$2` to `$13` of both append
/// statements (`$1` is the run id).
/// The batch's first event names its writer (the connection's `baton.writer`).
const BATCH_INSERT: &str = "INSERT INTO events (run_id, seq, at_us, kind, version, level_id, attempt, data, hash, writer)
               SELECT $1::text, u.*, CASE WHEN u.seq = ($2::bigint[])[1] THEN current_setting('baton.writer', true) END
                 FROM UNNEST($2::bigint[], $3::bigint[], $4::text[], $5::int[], $6::text[], $7::bigint[], $8::text[], $9::bytea[])
                   AS u(seq, at_us, kind, version, level_id, attempt, data, hash)";

/// The run's new end, and the newest event version its log holds (which no worker that
/// reads only older ones claims).
const BATCH_UPDATE: &str = "UPDATE runs SET last_seq = $10, status = $11, updated_us = $12, head_hash = $13,
    events_version = GREATEST(events_version, (SELECT COALESCE(MAX(v), 0) FROM UNNEST($5::int[]) v)::smallint)";

/// The advisory lock claims of runs under a limit take turns on (0x6261746f6e71,
/// "batonq"), for the claim's transaction.
const CLAIM_TURN: &str = "SELECT pg_advisory_xact_lock(108170704809585)";

/// Whether the run `$1`, just claimed in this transaction, takes its queue or its tenant
/// past its limit (the runs leased at `$2` counted, this one with them).
const CLAIM_RECOUNT: &str = "SELECT
    EXISTS (SELECT 1 FROM queues q WHERE q.name = j.queue AND q.max_running IS NOT NULL
              AND q.max_running < (SELECT count(*) FROM runs x
                   JOIN runs xj ON xj.run_id = COALESCE(x.root_run_id, x.run_id)
                   WHERE x.lease_owner IS NOT NULL AND x.status = 'running'
                     AND x.lease_until_us >= $2 AND xj.queue = j.queue))
 OR EXISTS (SELECT 1 FROM tenant_limits t WHERE t.tenant = j.tenant
              AND t.max_running < (SELECT count(*) FROM runs x
                   WHERE x.lease_owner IS NOT NULL AND x.status = 'running'
                     AND x.lease_until_us >= $2 AND x.tenant = j.tenant))
  FROM runs r JOIN runs j ON j.run_id = COALESCE(r.root_run_id, r.run_id)
 WHERE r.run_id = $1";

/// The claim: `$1` the worker, `$2` its lease's end, `$3` now, `$4`, `$5` its session,
/// `$6` the queues it takes (none: every queue), `$7` its home. The run due first that is
/// running, not leased (or its lease ran out, or its holder's session is gone), whose job
/// no process drives, whose job's root waits in one of the queues, whose job's runs have
/// no workspace on another home and no event newer than this build reads, and whose
/// queue and tenant are under their limits as far as this statement sees (the runs leased
/// now counted; [`CLAIM_RECOUNT`] decides, under [`CLAIM_TURN`]). Returns the run and
/// whether its queue or tenant has a limit.
fn claim_sql() -> &'static String {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let version = baton_engine::event::VERSION;
        // The live sessions are read once per claim: the walk passes every run in flight
        // (older than the queued ones), and reading `pg_stat_activity` for each cost
        // milliseconds a claim.
        format!(
            "WITH alive AS MATERIALIZED (
               SELECT a.pid, a.backend_start FROM pg_stat_get_activity(NULL) a
                WHERE a.pid IS NOT NULL AND a.backend_start IS NOT NULL)
             UPDATE runs SET lease_owner = $1, lease_until_us = $2, lease_pid = $4, lease_since = $5
              WHERE run_id = (
               SELECT r.run_id FROM runs r JOIN runs j ON j.run_id = COALESCE(r.root_run_id, r.run_id)
                WHERE r.status = 'running'
                  AND (r.lease_until_us IS NULL OR r.lease_until_us < $3
                       OR NOT EXISTS (SELECT 1 FROM alive a
                            WHERE a.pid = r.lease_pid AND a.backend_start = r.lease_since))
                  AND NOT EXISTS (SELECT 1 FROM holds h JOIN alive a
                         ON a.pid = h.holder_pid AND a.backend_start = h.holder_since
                       WHERE h.run_id = j.run_id AND h.until_us >= {NOW_US})
                  AND (cardinality($6::text[]) = 0 OR j.queue = ANY($6::text[]))
                  AND (j.home IS NULL OR j.home = $7::text) AND j.events_version <= {version}
                  AND NOT EXISTS (SELECT 1 FROM runs o
                       WHERE o.root_run_id = j.run_id
                         AND ((o.home IS NOT NULL AND o.home IS DISTINCT FROM $7::text)
                              OR o.events_version > {version}))
                  AND NOT EXISTS (SELECT 1 FROM queues q
                       WHERE q.name = j.queue AND q.max_running IS NOT NULL
                         AND q.max_running <= (SELECT count(*) FROM runs x
                              JOIN runs xj ON xj.run_id = COALESCE(x.root_run_id, x.run_id)
                              WHERE x.lease_owner IS NOT NULL AND x.status = 'running'
                                AND x.lease_until_us >= $3 AND xj.queue = j.queue))
                  AND NOT EXISTS (SELECT 1 FROM tenant_limits t
                       WHERE t.tenant = j.tenant
                         AND t.max_running <= (SELECT count(*) FROM runs x
                              WHERE x.lease_owner IS NOT NULL AND x.status = 'running'
                                AND x.lease_until_us >= $3 AND x.tenant = j.tenant))
                ORDER BY COALESCE(r.due_us, r.created_us), r.run_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED)
             RETURNING {RUN_COLUMNS},
               EXISTS (SELECT 1 FROM runs j JOIN queues q ON q.name = j.queue
                        WHERE j.run_id = COALESCE(runs.root_run_id, runs.run_id)
                          AND q.max_running IS NOT NULL)
               OR EXISTS (SELECT 1 FROM runs j JOIN tenant_limits t ON t.tenant = j.tenant
                           WHERE j.run_id = COALESCE(runs.root_run_id, runs.run_id))"
        )
    });
    &SQL
}

/// Appends under the run's row lock, the end of the log checked first (the slow path, and
/// the one that says exactly what is wrong); the run's new end.
async fn append(
    tx: &deadpool_postgres::Transaction<'_>,
    run_id: &str,
    expected: u64,
    events: &[Event],
    status: &str,
    fence: Option<(&str, i64)>,
) -> Result<Verified, Error> {
    let end = end_of_log(tx, run_id, fence).await?;
    let actual = end.last_seq + 1;
    if actual != expected {
        return Err(Error::Conflict { run_id: run_id.to_owned(), expected, actual });
    }
    check_numbering(events, expected)?;
    let b = Batch::new(events, end);
    let stmt = tx
        .prepare_cached(&format!(
            "WITH inserted AS ({BATCH_INSERT}), updated AS ({BATCH_UPDATE} WHERE run_id = $1 RETURNING run_id)
             SELECT pg_notify('baton_events', run_id) FROM updated"
        ))
        .await
        .map_err(pg)?;
    tx.query(&stmt, &b.params(&run_id, &status)).await.map_err(pg)?;
    Ok(b.end())
}

/// The run's events after `after`, checked against the chain and the run's record, read in
/// one statement (so one snapshot).
async fn load_checked(
    c: &Client,
    run_id: &str,
    after: u64,
) -> Result<(Vec<Event>, Verified), Error> {
    let rows = query(
        c,
        &format!(
            "SELECT {}, e.seq, e.at_us, e.kind, e.version, e.level_id, e.attempt, e.data, e.hash, r.chain
               FROM runs r LEFT JOIN events e ON e.run_id = r.run_id AND e.seq >= $2
              WHERE r.run_id = $1 ORDER BY e.seq",
            RUN_COLUMNS.split(", ").map(|c| format!("r.{c}")).collect::<Vec<_>>().join(", ")
        ),
        &[&run_id, &seq_param(after)],
    )
    .await?;
    let Some(first) = rows.first() else { return Err(Error::NotFound(run_id.to_owned())) };
    let (record, head) = to_record(first)?;
    let damaged =
        |seq: u64, problem: String| Error::Damaged { run_id: run_id.to_owned(), seq, problem };
    // The events' columns come after the run's.
    let e_at = RUN_COLUMN_COUNT;
    let form: i16 = first.try_get(e_at + 8).map_err(pg)?;
    let form = Form::from_number(form.into()).ok_or_else(|| Form::unknown(run_id, form.into()))?;
    let seq_of = |r: &Row| r.try_get::<_, Option<i64>>(e_at).map_err(pg);
    let mut rest = &rows[..];
    if seq_of(first)?.is_none() {
        rest = &[];
    }
    let mut check = if after == 0 {
        Check::new(run_id, 0, GENESIS)
    } else {
        match rest.first() {
            Some(r) if seq_of(r)? == Some(seq_param(after)) => {
                let hash: Option<Vec<u8>> = r.try_get(e_at + 7).map_err(pg)?;
                let hash = hash.as_deref().and_then(chain::from_bytes).ok_or_else(|| {
                    damaged(after, "the event has no hash (or not a 32-byte one)".to_owned())
                })?;
                rest = &rest[1..];
                Check::new(run_id, after, hash)
            }
            _ if after >= record.last_seq => {
                return Ok((
                    Vec::new(),
                    Verified { last_seq: record.last_seq, head: GENESIS, form },
                ));
            }
            _ => return Err(damaged(after, "the event is missing".to_owned())),
        }
    };
    let mut events = Vec::with_capacity(rest.len());
    for r in rest {
        let next = check.next_seq();
        let seq = seq_of(r)?.unwrap_or_default();
        let seq = u64::try_from(seq).map_err(|_| {
            damaged(next, format!("the event after {} is numbered {seq}", next - 1))
        })?;
        check.seq(seq)?;
        let column = |e: tokio_postgres::Error| damaged(seq, e.to_string());
        let at_us: i64 = r.try_get(e_at + 1).map_err(column)?;
        let kind: String = r.try_get(e_at + 2).map_err(column)?;
        let version: i32 = r.try_get(e_at + 3).map_err(column)?;
        let version = u16::try_from(version).map_err(|_| {
            damaged(seq, format!("column `version` holds {version}, not a schema version"))
        })?;
        let level_id: Option<String> = r.try_get(e_at + 4).map_err(column)?;
        let attempt: Option<i64> = r.try_get(e_at + 5).map_err(column)?;
        let attempt = attempt
            .map(|a| {
                u32::try_from(a).map_err(|_| {
                    damaged(seq, format!("column `attempt` holds {a}, not an attempt"))
                })
            })
            .transpose()?;
        let data: String = r.try_get(e_at + 6).map_err(column)?;
        let hash: Option<Vec<u8>> = r.try_get(e_at + 7).map_err(column)?;
        let columns = crate::stored::Columns {
            seq,
            at_us,
            kind: &kind,
            version,
            level_id,
            attempt,
            data: &data,
            hash: hash.as_deref(),
        };
        events.push(crate::stored::checked(&mut check, run_id, form, columns)?);
    }
    let last_seq = check.finish(record.last_seq, head.as_ref())?;
    Ok((events, Verified { last_seq, head: head.unwrap_or(GENESIS), form }))
}

impl PostgresStore {
    /// The epoch of this process's hold on a run, when it holds it.
    fn epoch_of(&self, run_id: &str) -> Option<i64> {
        lock(&self.held).get(run_id).map(|h| h.epoch).filter(|e| *e != 0)
    }

    /// Enters a run in the map of held runs — being taken (epoch 0), or a new run's hold that
    /// its creation takes (epoch 1, pending) — Busy when this process holds it already; the
    /// release that forgets it and gives back what was taken.
    fn enter_hold(
        &self,
        run_id: &str,
        epoch: i64,
        valid_until: &Arc<Mutex<std::time::Instant>>,
    ) -> Result<Release, Error> {
        let mut held = lock(&self.held);
        if held.contains_key(run_id) {
            return Err(Error::Busy(run_id.to_owned()));
        }
        let run = HeldRun {
            epoch,
            pending: epoch != 0,
            known: None,
            valid_until: Arc::clone(valid_until),
        };
        held.insert(run_id.to_owned(), run);
        Ok(Release {
            run_id: run_id.to_owned(),
            held: Arc::clone(&self.held),
            appends: self.appends.clone(),
        })
    }

    /// Takes the hold of a new run whose creation did not take it (the slow path): its
    /// epoch, or Busy when another process holds a run of that id.
    async fn take_pending(&self, run_id: &str) -> Result<i64, Error> {
        self.take(run_id).await?.ok_or_else(|| Error::Busy(run_id.to_owned()))
    }

    /// Takes the hold of a run entered in the map of held runs: its epoch, recorded in the
    /// map with how long the hold surely lasts; none when another process holds the run.
    async fn take(&self, run_id: &str) -> Result<Option<i64>, Error> {
        let sent = std::time::Instant::now();
        let taken = self.hold_op(|tx| HoldOp::Take(run_id.to_owned(), tx)).await?;
        if let Some(epoch) = taken
            && let Some(h) = lock(&self.held).get_mut(run_id)
        {
            h.epoch = epoch;
            h.pending = false;
            *lock(&h.valid_until) = sent + self.hold_for;
        }
        Ok(taken)
    }

    /// The hold's epoch and the end of the log this process knows, for a run it holds.
    fn known_end(&self, run_id: &str) -> Option<(i64, Verified)> {
        let held = lock(&self.held);
        let run = held.get(run_id).filter(|h| h.epoch != 0)?;
        Some((run.epoch, run.known?))
    }

    /// Remembers where a run this process holds ends (after a whole load or an append).
    fn knows(&self, run_id: &str, end: Verified) {
        knows(&self.held, run_id, end);
    }

    async fn run_rows(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<RunRecord>, Error> {
        let c = self.client().await?;
        records(&query(&c, sql, params).await?)
    }
}

impl EventStore for PostgresStore {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let epoch = self.epoch_of(&run.run_id);
            let pending = lock(&self.held).get(&run.run_id).is_some_and(|h| h.pending);
            if let Some(claim) = &run.idempotency {
                // A run whose claim expired lets the key go (a claim made after this, by
                // anyone, is decided by the key's unique index).
                let c = self.client().await?;
                let release = "UPDATE runs SET idempotency_key = NULL, key_request = NULL, key_expires_us = NULL
                    WHERE COALESCE(tenant, '') = COALESCE($1, '') AND idempotency_key = $2
                      AND key_expires_us <= $3";
                let now = micros(Utc::now());
                c.execute(release, &[&run.tenant, &claim.key, &now]).await.map_err(pg)?;
            }
            // A run this process holds is created in a group with other runs' appends (one
            // statement, which takes a new run's hold too); the slow path when that misses
            // says what is wrong (the id taken, the hold lost). A run with an idempotency
            // key takes the slow path, which names the run holding the key; so does a run
            // with a placement of its own (a queue, a priority, a home).
            if let Some(epoch) = epoch
                && run.idempotency.is_none()
                && run.placement.is_default()
                && check_numbering(&events, 1).is_ok()
            {
                let batch = Batch::new(&events, Verified::fresh());
                let (reply, answer) = oneshot::channel();
                let append = group::KnownAppend {
                    run_id: run.run_id.clone(),
                    known: (0, GENESIS),
                    epoch,
                    status: run.status.clone(),
                    new: Some(group::NewRun {
                        scenario_id: run.scenario_id.clone(),
                        created_us: micros(run.created_at),
                        updated_us: if events.is_empty() {
                            micros(run.updated_at)
                        } else {
                            batch.updated_us
                        },
                        parent_run_id: run.parent_run_id.clone(),
                        root_run_id: run.root_run_id.clone(),
                        tenant: run.tenant.clone(),
                        take_hold: pending,
                    }),
                    batch,
                    reply,
                };
                if self.appends.send(group::Queued::Append(Box::new(append))).is_ok()
                    && let Ok(applied) = answer.await
                    && applied?
                {
                    if let Some(h) = lock(&self.held).get_mut(&run.run_id) {
                        h.pending = false;
                    }
                    self.growth.created(&self.pool);
                    return Ok(());
                }
            }
            // A new run's hold its creation could not take is taken on its own first.
            let epoch = if pending { Some(self.take_pending(&run.run_id).await?) } else { epoch };
            let c = self.client().await?;
            let fence = epoch.map(|e| (self.holder.as_str(), e));
            match create(&c, run, &events, fence).await {
                Ok(end) => {
                    self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.knows(&run.run_id, end);
                    self.growth.created(&self.pool);
                    Ok(())
                }
                Err(Error::KeyTaken { key, .. }) => {
                    // Another process holds the key: name its run.
                    let owner = self.run_by_key(run.tenant.as_deref(), &key).await?;
                    Err(Error::KeyTaken {
                        key,
                        run_id: owner.map_or_else(|| "another run".to_owned(), |r| r.run_id),
                    })
                }
                Err(e) => Err(e),
            }
        })
    }

    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected_seq: u64,
        events: Vec<Event>,
        status: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            if let Some(dir) = crate::barrier::reached(&events) {
                crate::barrier::wait(&dir).await;
            }
            let commits = &self.commits;
            // The driver's appends follow each other on the end it knows: written in a
            // group with other runs' (one statement), the slow path when that misses.
            if let Some((epoch, known)) = self.known_end(run_id)
                && known.last_seq + 1 == expected_seq
                && check_numbering(&events, expected_seq).is_ok()
            {
                let (reply, answer) = oneshot::channel();
                let append = group::KnownAppend {
                    run_id: run_id.to_owned(),
                    known: (known.last_seq, known.head),
                    epoch,
                    status: status.to_owned(),
                    batch: Batch::new(&events, known),
                    new: None,
                    reply,
                };
                if self.appends.send(group::Queued::Append(Box::new(append))).is_ok()
                    && let Ok(applied) = answer.await
                    && applied?
                {
                    return Ok(());
                }
            }
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg)?;
            let epoch = self.epoch_of(run_id);
            let fence = epoch.map(|e| (self.holder.as_str(), e));
            let end = append(&tx, run_id, expected_seq, &events, status, fence).await?;
            tx.commit().await.map_err(pg)?;
            commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.knows(run_id, end);
            Ok(())
        })
    }

    fn load<'a>(&'a self, run_id: &'a str, after: u64) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let (events, end) = load_checked(&c, run_id, after).await?;
            if after == 0 {
                self.knows(run_id, end);
            }
            Ok(events)
        })
    }

    fn writers<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, String)>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = query(
                &c,
                "SELECT e.seq, e.writer FROM runs r LEFT JOIN events e
                    ON e.run_id = r.run_id AND e.writer IS NOT NULL
                 WHERE r.run_id = $1 ORDER BY e.seq",
                &[&run_id],
            )
            .await?;
            if rows.is_empty() {
                return Err(Error::NotFound(run_id.to_owned()));
            }
            let mut writers = Vec::new();
            for row in rows {
                let seq: Option<i64> = row.try_get(0).map_err(pg)?;
                let writer: Option<String> = row.try_get(1).map_err(pg)?;
                if let (Some(seq), Some(writer)) = (seq, writer) {
                    writers.push((seq as u64, writer));
                }
            }
            Ok(writers)
        })
    }

    fn verify<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Verified, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            load_checked(&c, run_id, 0).await.map(|(_, verified)| verified)
        })
    }

    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1");
            Ok(self.run_rows(&sql, &[&run_id]).await?.into_iter().next())
        })
    }

    fn run_by_key<'a>(
        &'a self,
        tenant: Option<&'a str>,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs
                  WHERE COALESCE(tenant, '') = COALESCE($1, '') AND idempotency_key = $2
                    AND key_expires_us > $3"
            );
            let now = micros(Utc::now());
            Ok(self.run_rows(&sql, &[&tenant, &key, &now]).await?.into_iter().next())
        })
    }

    fn keys_held<'a>(
        &'a self,
        tenant: Option<&'a str>,
        limit: u64,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = query(
                &c,
                "SELECT COUNT(*) FROM (SELECT 1 FROM runs
                  WHERE COALESCE(tenant, '') = COALESCE($1, '') AND idempotency_key IS NOT NULL
                    AND key_expires_us > $2 LIMIT $3) AS held",
                &[&tenant, &micros(Utc::now()), &limit],
            )
            .await?;
            let held: i64 = rows.first().map_or(0, |r| r.get(0));
            Ok(held.max(0) as u64)
        })
    }

    fn runs_named<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<RunRecord>>, Error>> {
        Box::pin(async move {
            let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ANY($1)");
            let found = self.run_rows(&sql, &[&ids]).await?;
            let mut by_id: HashMap<String, RunRecord> =
                found.into_iter().map(|r| (r.run_id.clone(), r)).collect();
            Ok(ids.iter().map(|id| by_id.remove(id)).collect())
        })
    }

    fn put_tenant_override<'a>(
        &'a self,
        o: &'a TenantOverride,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            query(
                &c,
                "INSERT INTO tenant_overrides (tenant, scenario_id, yaml, updated_us) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (tenant, scenario_id) DO UPDATE SET yaml = EXCLUDED.yaml, updated_us = EXCLUDED.updated_us",
                &[&o.tenant, &o.scenario_id, &o.yaml, &micros(o.updated_at)],
            )
            .await?;
            Ok(())
        })
    }

    fn tenant_overrides<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TenantOverride>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = query(
                &c,
                "SELECT tenant, scenario_id, yaml, updated_us FROM tenant_overrides
                  WHERE ($1::text IS NULL OR tenant = $1) ORDER BY tenant, scenario_id",
                &[&tenant],
            )
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(TenantOverride {
                        tenant: r.try_get(0).map_err(pg)?,
                        scenario_id: r.try_get(1).map_err(pg)?,
                        yaml: r.try_get(2).map_err(pg)?,
                        updated_at: from_micros(r.try_get(3).map_err(pg)?, "updated_us")
                            .map_err(Error::Backend)?,
                    })
                })
                .collect()
        })
    }

    fn remove_tenant_override<'a>(
        &'a self,
        tenant: &'a str,
        scenario_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "DELETE FROM tenant_overrides WHERE tenant = $1 AND scenario_id = $2",
                )
                .await
                .map_err(pg)?;
            Ok(c.execute(&stmt, &[&tenant, &scenario_id]).await.map_err(pg)? == 1)
        })
    }

    fn put_scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
        scenario_id: &'a str,
        texts: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "INSERT INTO scenario_texts (checksum, scenario_id, texts, created_us) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (checksum) DO NOTHING",
                )
                .await
                .map_err(pg)?;
            let n = c
                .execute(&stmt, &[&checksum, &scenario_id, &texts, &micros(Utc::now())])
                .await
                .map_err(pg)?;
            Ok(n == 1)
        })
    }

    fn scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows =
                query(&c, "SELECT texts FROM scenario_texts WHERE checksum = $1", &[&checksum])
                    .await?;
            rows.first().map(|r| r.try_get(0).map_err(pg)).transpose()
        })
    }

    /// Deletes the runs, their events and holds in one transaction, then vacuums the two
    /// tables so that the deleted rows are not left readable in them.
    fn purge<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg)?;
            tx.execute("DELETE FROM events WHERE run_id = ANY($1)", &[&run_ids])
                .await
                .map_err(pg)?;
            tx.execute("DELETE FROM holds WHERE run_id = ANY($1)", &[&run_ids])
                .await
                .map_err(pg)?;
            let removed = tx
                .execute("DELETE FROM runs WHERE run_id = ANY($1)", &[&run_ids])
                .await
                .map_err(pg)?;
            tx.commit().await.map_err(pg)?;
            if removed > 0 {
                c.batch_execute("VACUUM events, runs").await.map_err(pg)?;
            }
            Ok(removed)
        })
    }

    fn runs<'a>(&'a self, status: Option<&'a str>) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE ($1::text IS NULL OR status = $1) ORDER BY created_us DESC, run_id DESC"
            );
            self.run_rows(&sql, &[&status]).await
        })
    }

    fn runs_page<'a>(&'a self, q: &'a RunQuery) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        Box::pin(async move {
            let (tenant_filtered, tenant) = match &q.tenant {
                Some(t) => (true, t.as_deref()),
                None => (false, None),
            };
            let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
            let sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs
                  WHERE (NOT $1 OR tenant IS NOT DISTINCT FROM $2::text)
                    AND ($3::text IS NULL OR status = $3)
                    AND ($4::text IS NULL OR scenario_id = $4)
                    AND (NOT $5 OR parent_run_id IS NULL)
                    AND ($6::text IS NULL OR (created_us, run_id) <
                         (SELECT created_us, run_id FROM runs WHERE run_id = $6))
                  ORDER BY created_us DESC, run_id DESC LIMIT $7"
            );
            self.run_rows(
                &sql,
                &[
                    &tenant_filtered,
                    &tenant,
                    &q.status,
                    &q.scenario_id,
                    &q.roots_only,
                    &q.after_run,
                    &limit,
                ],
            )
            .await
        })
    }

    /// The feed by (transaction id, position): only rows of transactions older than every
    /// one still running are read, so none committed later can fall below a cursor given.
    fn feed<'a>(
        &'a self,
        tenant: &'a Option<Option<String>>,
        after: FeedCursor,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FeedRef>, Error>> {
        Box::pin(async move {
            let (filtered, tenant) = match tenant {
                Some(t) => (true, t.as_deref()),
                None => (false, None),
            };
            let tx = after.major.to_string();
            let pos = i64::try_from(after.minor).unwrap_or(i64::MAX);
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let c = self.client().await?;
            let rows = query(
                &c,
                "SELECT e.tx::text, e.pos, e.run_id, e.seq FROM events e
                   JOIN runs r ON r.run_id = e.run_id
                  WHERE (e.tx, e.pos) > ($1::text::xid8, $2::bigint)
                    AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
                    AND (NOT $3 OR r.tenant IS NOT DISTINCT FROM $4::text)
                  ORDER BY e.tx, e.pos LIMIT $5",
                &[&tx, &pos, &filtered, &tenant, &limit],
            )
            .await?;
            rows.iter()
                .map(|row| {
                    let tx: String = row.get(0);
                    let major = tx.parse::<u64>().map_err(|e| {
                        Error::Backend(format!("the feed read a transaction id {tx:?}: {e}"))
                    })?;
                    let pos: i64 = row.get(1);
                    let seq: i64 = row.get(3);
                    Ok(FeedRef {
                        cursor: FeedCursor { major, minor: u64::try_from(pos).unwrap_or_default() },
                        run_id: row.get(2),
                        seq: u64::try_from(seq).unwrap_or_default(),
                    })
                })
                .collect()
        })
    }

    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        what: &'a baton_engine::store::Claimable,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(pg)?;
            let (until, now) = (micros(until), micros(now));
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                [&worker, &until, &now, &self.session.0, &self.session.1, &what.queues, &what.home];
            let claim = tx.prepare_cached(claim_sql()).await.map_err(pg)?;
            let rows = tx.query(&claim, &params).await.map_err(pg)?;
            let Some(row) = rows.first() else {
                tx.commit().await.map_err(pg)?;
                return Ok(None);
            };
            let (record, _) = to_record(row)?;
            // A run whose queue or tenant has a limit: claims of such runs take turns (the
            // lock is the transaction's, let go at its end) and count again once it is
            // theirs, each seeing every claim committed before it; past the limit, this
            // one is undone. Runs with no limit never wait.
            let limited: bool = row.try_get(RUN_COLUMN_COUNT).map_err(pg)?;
            if limited {
                let turn = tx.prepare_cached(CLAIM_TURN).await.map_err(pg)?;
                tx.execute(&turn, &[]).await.map_err(pg)?;
                let recount = tx.prepare_cached(CLAIM_RECOUNT).await.map_err(pg)?;
                let over: bool =
                    tx.query_one(&recount, &[&record.run_id, &now]).await.map_err(pg)?.get(0);
                if over {
                    tx.rollback().await.map_err(pg)?;
                    return Ok(None);
                }
            }
            tx.commit().await.map_err(pg)?;
            Ok(Some(record))
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
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "UPDATE runs SET lease_until_us = $4 WHERE run_id = $1 AND lease_owner = $2 AND lease_until_us >= $3",
                )
                .await
                .map_err(pg)?;
            let n = c
                .execute(&stmt, &[&run_id, &worker, &micros(now), &micros(until)])
                .await
                .map_err(pg)?;
            Ok(n == 1)
        })
    }

    fn release<'a>(&'a self, run_id: &'a str, worker: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "UPDATE runs SET lease_owner = NULL, lease_until_us = NULL WHERE run_id = $1 AND lease_owner = $2",
                )
                .await
                .map_err(pg)?;
            c.execute(&stmt, &[&run_id, &worker]).await.map_err(pg)?;
            Ok(())
        })
    }

    /// A row of `holds` naming this process, renewed while the guard lives; the guard's
    /// fence says whether it is surely still this process's.
    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        Box::pin(async move {
            let valid_until = Arc::new(Mutex::new(std::time::Instant::now()));
            // Dropped on any way out but success (a refusal, an error, this future dropped
            // half way), `release` forgets the run here and gives back what was taken.
            let release = self.enter_hold(run_id, 0, &valid_until)?;
            match self.take(run_id).await {
                Ok(Some(_)) => Ok(RunGuard::fenced(release, hold_fence(run_id, valid_until))),
                Ok(None) => Err(Error::Busy(run_id.to_owned())),
                Err(e) => Err(e),
            }
        })
    }

    /// A new run's hold is taken by the group statement that creates the run, not by a
    /// statement of its own: the run's id is new, so no process holds it, and none can
    /// before the run exists.
    fn hold_new<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        Box::pin(async move {
            let valid_until = Arc::new(Mutex::new(std::time::Instant::now() + self.hold_for));
            let release = self.enter_hold(run_id, 1, &valid_until)?;
            Ok(RunGuard::fenced(release, hold_fence(run_id, valid_until)))
        })
    }

    fn is_held<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            if lock(&self.held).contains_key(run_id) {
                return Ok(true);
            }
            self.hold_op(|tx| HoldOp::Probe(run_id.to_owned(), tx)).await
        })
    }

    /// Wakes on every process's appends to the run (the listen connection's notices);
    /// none when that connection cannot be opened.
    /// Every append notifies on [`CHANNEL`], which the notifier's connection listens to.
    fn notices_other_processes(&self) -> bool {
        true
    }

    /// Published on [`live::LIVE_CHANNEL`], best effort: a full queue drops the piece.
    fn share_live(&self, text: &LiveText) {
        let out = self.live_out.get_or_init(|| live::start(self.pool.clone()));
        let _ = out.try_send(text.clone());
    }

    fn live_from_others(
        &self,
    ) -> BoxFuture<'_, Option<tokio::sync::broadcast::Receiver<LiveText>>> {
        Box::pin(async move {
            let client = self.listening.get_or_try_init(|| self.listen()).await.ok()?;
            // Named as a listener, so that workers publish their pieces.
            self.live_listening
                .get_or_try_init(|| async { client.batch_execute(live::LISTENER).await })
                .await
                .ok()?;
            Some(self.live_in.subscribe())
        })
    }

    fn notifier<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Option<Arc<Notify>>> {
        Box::pin(async move {
            self.listening.get_or_try_init(|| self.listen()).await.ok()?;
            let mut waiters = lock(&self.waiters);
            // Notifiers nobody holds any more are dropped as new ones are made.
            if waiters.len() > 1024 {
                waiters.retain(|_, n| Arc::strong_count(n) > 1);
            }
            Some(Arc::clone(waiters.entry(run_id.to_owned()).or_default()))
        })
    }

    fn wait_for_events<'a>(
        &'a self,
        run_id: &'a str,
        after: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            // Without the listen connection (it cannot be opened), waiters look every
            // WAIT_LOOK_EVERY.
            let _ = self.listening.get_or_try_init(|| self.listen()).await;
            let notify = Arc::clone(lock(&self.waiters).entry(run_id.to_owned()).or_default());
            let waited = async {
                loop {
                    let woken = notify.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    if self.run(run_id).await?.is_some_and(|r| r.last_seq > after) {
                        return Ok(true);
                    }
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        return Ok(false);
                    }
                    let _ =
                        tokio::time::timeout((deadline - now).min(WAIT_LOOK_EVERY), woken).await;
                }
            }
            .await;
            let mut waiters = lock(&self.waiters);
            if waiters.get(run_id).is_some_and(|n| Arc::strong_count(n) <= 2) {
                waiters.remove(run_id);
            }
            drop(notify);
            waited
        })
    }
}

/// The fence of a hold: refuses once the hold may have run out unrenewed.
fn hold_fence(run_id: &str, valid_until: Arc<Mutex<std::time::Instant>>) -> Fence {
    let id = run_id.to_owned();
    Fence::new(move || {
        if std::time::Instant::now() < *lock(&valid_until) {
            Ok(())
        } else {
            Err(format!(
                "this process's hold on run {id} ran out before it was renewed (the process stalled); another process may drive the run now"
            ))
        }
    })
}

/// Gives a run's hold back when its guard is dropped.
struct Release {
    run_id: String,
    held: Held,
    /// The group writer's queue, which writes give-backs with the next group.
    appends: mpsc::UnboundedSender<group::Queued>,
}

impl Drop for Release {
    fn drop(&mut self) {
        // The give-back is queued before the run leaves the map (under its lock): a row of
        // `holds` that names this process for a run it does not have in its map is one being
        // given back, which a later taking in this process takes over (a new epoch) and a
        // probe from this process does not count. Nothing is given back for a hold never
        // taken (epoch 0); a new run's hold that its creation never took gives back nothing
        // that is there.
        let mut held = lock(&self.held);
        if let Some(run) = held.get(&self.run_id)
            && run.epoch != 0
        {
            let _ = self.appends.send(group::Queued::Give(self.run_id.clone(), run.epoch));
        }
        held.remove(&self.run_id);
    }
}

impl TokenStore for PostgresStore {
    fn put_token<'a>(&'a self, t: &'a TokenRecord) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "INSERT INTO tokens (id, sha256, tenant, role, name, created_us, revoked_us) VALUES ($1, $2, $3, $4, $5, $6, NULL)",
                )
                .await
                .map_err(pg)?;
            c.execute(
                &stmt,
                &[&t.id, &t.sha256, &t.tenant, &t.role.as_str(), &t.name, &micros(t.created_at)],
            )
            .await
            .map_err(|e| Error::Backend(format!("cannot keep token {}: {}", t.id, db_error(&e))))?;
            Ok(())
        })
    }

    fn token_by_hash<'a>(
        &'a self,
        sha256: &'a str,
    ) -> BoxFuture<'a, Result<Option<TokenRecord>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = query(
                &c,
                &format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE sha256 = $1"),
                &[&sha256],
            )
            .await?;
            rows.first().map(to_token).transpose()
        })
    }

    fn tokens<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TokenRecord>, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let rows = query(
                &c,
                &format!(
                    "SELECT {TOKEN_COLUMNS} FROM tokens WHERE ($1::text IS NULL OR tenant = $1) ORDER BY created_us, id"
                ),
                &[&tenant],
            )
            .await?;
            rows.iter().map(to_token).collect()
        })
    }

    fn revoke_token<'a>(
        &'a self,
        id: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let c = self.client().await?;
            let stmt = c
                .prepare_cached(
                    "UPDATE tokens SET revoked_us = $2 WHERE id = $1 AND revoked_us IS NULL",
                )
                .await
                .map_err(pg)?;
            Ok(c.execute(&stmt, &[&id, &micros(at)]).await.map_err(pg)? == 1)
        })
    }

    fn put_session<'a>(
        &'a self,
        session: &'a SessionRecord,
        per_token: usize,
        forget_before: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, Error>> {
        Box::pin(async move {
            let mut c = self.client().await?;
            sessions::put(&mut c, session, per_token, forget_before).await
        })
    }

    fn session_by_hash<'a>(
        &'a self,
        sha256: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord>, Error>> {
        Box::pin(async move { sessions::by_hash(&self.client().await?, sha256).await })
    }

    fn touch_session<'a>(
        &'a self,
        sha256: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { sessions::touch(&self.client().await?, sha256, at).await })
    }

    fn revoke_session<'a>(
        &'a self,
        sha256: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move { sessions::revoke(&self.client().await?, sha256, at).await })
    }
}

const TOKEN_COLUMNS: &str = "id, sha256, tenant, role, name, created_us, revoked_us";

fn to_token(r: &Row) -> Result<TokenRecord, Error> {
    let id: String = r.try_get(0).map_err(pg)?;
    let role: String = r.try_get(3).map_err(pg)?;
    let role = Role::parse(&role)
        .ok_or_else(|| Error::Backend(format!("token {id} has the unknown role {role:?}")))?;
    let revoked: Option<i64> = r.try_get(6).map_err(pg)?;
    Ok(TokenRecord {
        sha256: r.try_get(1).map_err(pg)?,
        tenant: r.try_get(2).map_err(pg)?,
        role,
        name: r.try_get(4).map_err(pg)?,
        created_at: from_micros(r.try_get(5).map_err(pg)?, "created_us").map_err(Error::Backend)?,
        revoked_at: revoked
            .map(|us| from_micros(us, "revoked_us"))
            .transpose()
            .map_err(Error::Backend)?,
        id,
    })
}

/// A schema of its own in a database, for a test or a bench: created empty, and dropped
/// with everything in it when this is dropped.
#[derive(Debug)]
pub struct ScratchSchema {
    base: String,
    name: String,
    /// The base URL, its connections' `search_path` set to the schema.
    pub url: String,
}

impl ScratchSchema {
    /// Creates a schema named `baton_<label>_<random>` in the database at `base`.
    pub async fn create(base: &str, label: &str) -> Result<Self, Error> {
        let suffix = uuid_like();
        let label: String =
            label.chars().filter(char::is_ascii_alphanumeric).take(20).collect::<String>();
        let name = format!("baton_{}_{suffix}", label.to_ascii_lowercase());
        let config = config(base)?;
        let (client, _task) = connect_one(&config, base).await?;
        client.batch_execute(&format!("CREATE SCHEMA {name}")).await.map_err(pg)?;
        let joiner = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{joiner}options=-csearch_path%3D{name}");
        Ok(ScratchSchema { base: base.to_owned(), name, url })
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // A runtime of its own on a thread of its own: this may be dropped inside another
        // runtime, or outside any.
        let dropped = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(config) = config(&base) else { return };
                if let Ok((client, _task)) = connect_one(&config, &base).await {
                    let _ = client.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await;
                }
            });
        });
        let _ = dropped.join();
    }
}

/// 16 hex digits that differ between calls and processes.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed =
        format!("{nanos}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let digest = Sha256::digest(seed.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}
