//! What every event store promises: the [`EventStore`] trait and the values it takes and
//! returns (run records, queries, leases and fences).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::chain::{Form, Hash};
use crate::event::Event;
use crate::future::BoxFuture;

use crate::store::error::Error;
/// A run as the store lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunRecord {
    pub run_id: String,
    pub scenario_id: String,
    /// The status as of the last append (`running`, `paused`, `completed` …).
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_seq: u64,
    /// The run that started this one, for a child run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// The first run of the job this one belongs to, for a child run (a root names none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    /// The key the job was started with: while it holds, it names this run and no other
    /// of the run's tenant. Listed as its key alone.
    #[serde(rename = "idempotency_key", skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<KeyClaim>,
    /// The tenant whose overrides the run's scenario was merged with (the runs it starts
    /// belong to it too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Where its job waits for a driver, and which drivers may take it.
    #[serde(flatten)]
    pub placement: crate::store::Placement,
}

impl RunRecord {
    /// A run just created at `at`: no events yet, no parent, key or tenant (set those with
    /// struct update syntax).
    pub fn new(run_id: &str, scenario_id: &str, status: &str, at: DateTime<Utc>) -> RunRecord {
        RunRecord {
            run_id: run_id.to_owned(),
            scenario_id: scenario_id.to_owned(),
            status: status.to_owned(),
            created_at: at,
            updated_at: at,
            last_seq: 0,
            parent_run_id: None,
            root_run_id: None,
            idempotency: None,
            tenant: None,
            placement: crate::store::Placement::default(),
        }
    }
}

/// A job's idempotency key as its first run holds it: scoped to the run's tenant, bound to
/// the request that claimed it, and held until it expires. A second start with a held key
/// gets the first run (with the same request) or a refusal (with another); once the key
/// expires, a start with it begins a new job.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyClaim {
    pub key: String,
    /// A digest of the request that claimed the key; empty for a key kept from before
    /// requests were digested, which any request matches.
    pub request: String,
    pub expires_at: DateTime<Utc>,
}

impl KeyClaim {
    /// Whether `request` (a digest) is the one that claimed the key.
    pub fn matches(&self, request: &str) -> bool {
        self.request.is_empty() || self.request == request
    }
}

impl Serialize for KeyClaim {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.key)
    }
}

/// A tenant's override of one scenario: partial YAML, deep-merged over the base scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantOverride {
    pub tenant: String,
    pub scenario_id: String,
    pub yaml: String,
    pub updated_at: DateTime<Utc>,
}

/// Which runs a page of the run list holds: newest first, filtered, after a cursor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunQuery {
    /// Only runs of this tenant (`Some(None)`: only runs of no tenant).
    pub tenant: Option<Option<String>>,
    /// Only runs with this stored status.
    pub status: Option<String>,
    pub scenario_id: Option<String>,
    /// Only the first runs of jobs (no child runs).
    pub roots_only: bool,
    /// Only runs listed after this one (the last run of the previous page).
    pub after_run: Option<String>,
    /// At most this many runs.
    pub limit: usize,
}

impl RunQuery {
    /// Whether a run belongs on a page of this query (the cursor aside).
    pub fn admits(&self, r: &RunRecord) -> bool {
        self.tenant.as_ref().is_none_or(|t| r.tenant == *t)
            && self.status.as_ref().is_none_or(|s| r.status == *s)
            && self.scenario_id.as_ref().is_none_or(|s| r.scenario_id == *s)
            && (!self.roots_only || r.parent_run_id.is_none())
    }
}

/// A place in the feed of every run's events ([`EventStore::feed`]), as the store numbers
/// it: written `MAJOR-MINOR`; [`FeedCursor::START`] is before everything. Cursors grow in
/// the order the feed gives events and are never reused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FeedCursor {
    pub major: u64,
    pub minor: u64,
}

impl FeedCursor {
    /// Before every event.
    pub const START: FeedCursor = FeedCursor { major: 0, minor: 0 };

    /// Reads `MAJOR-MINOR` (decimal numbers of at most 19 digits each).
    pub fn parse(text: &str) -> Option<FeedCursor> {
        let (major, minor) = text.split_once('-')?;
        let number = |t: &str| -> Option<u64> {
            if t.is_empty() || t.len() > 19 || !t.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            t.parse().ok()
        };
        Some(FeedCursor { major: number(major)?, minor: number(minor)? })
    }
}

impl std::fmt::Display for FeedCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.major, self.minor)
    }
}

/// One event's place in the feed: its cursor, its run and its number there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedRef {
    pub cursor: FeedCursor,
    pub run_id: String,
    pub seq: u64,
}

/// What a whole-log check found in an intact run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The number of the run's last event (0 for a run without events).
    pub last_seq: u64,
    /// The hash of the run's last event ([`chain::GENESIS`] for a run without events).
    pub head: Hash,
    /// How the run's events are hashed, as recorded with the run.
    pub form: Form,
}

impl Verified {
    /// The end of a run about to be created: no events, today's form.
    pub fn fresh() -> Verified {
        Verified { last_seq: 0, head: crate::chain::GENESIS, form: Form::Encoded }
    }
}

/// Proof that this process drives a run: while it lives, no other process (or task) may
/// drive the same run; dropping it — or the process dying — lets the next driver in.
pub struct RunGuard {
    _holding: Box<dyn std::any::Any + Send + Sync>,
    fence: Option<Fence>,
}

impl RunGuard {
    /// A guard that releases by dropping `holding`.
    pub fn new(holding: impl std::any::Any + Send + Sync) -> Self {
        RunGuard { _holding: Box::new(holding), fence: None }
    }

    /// A guard whose hold can run out (a lease another process takes over once it has):
    /// `fence` says whether it still holds, before each write outside the log.
    pub fn fenced(holding: impl std::any::Any + Send + Sync, fence: Fence) -> Self {
        RunGuard { _holding: Box::new(holding), fence: Some(fence) }
    }

    /// The check that the hold is still this process's, for a hold that can run out; none
    /// for one that lasts as long as its holder (a lock the operating system keeps).
    pub fn fence(&self) -> Option<Fence> {
        self.fence.clone()
    }
}

/// Whether a hold that can run out is still this process's: checked before each write a
/// driver makes outside the log (a workspace's files), so a process that stalled past its
/// hold changes nothing once another has taken the run over. (Appends are fenced by the
/// store itself.)
#[derive(Clone)]
pub struct Fence(Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl Fence {
    pub fn new(check: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> Self {
        Fence(Arc::new(check))
    }

    /// `Err` with why, once the hold is no longer this process's.
    pub fn check(&self) -> Result<(), String> {
        (self.0)()
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}

impl std::fmt::Debug for RunGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunGuard")
    }
}

/// Checks that `events` are numbered in a row from `first`, as every store requires before
/// it writes them.
pub fn check_numbering(events: &[Event], first: u64) -> Result<(), Error> {
    for (expected, e) in (first..).zip(events) {
        if e.seq != expected {
            return Err(Error::Backend(format!("event {expected} is numbered {}", e.seq)));
        }
    }
    Ok(())
}

/// The name every batch this process appends records as its writer: `pid:PID` unless the
/// embedder named the process first ([`name_writer`]).
pub fn writer() -> std::sync::Arc<str> {
    std::sync::Arc::clone(
        WRITER.get_or_init(|| std::sync::Arc::from(format!("pid:{}", std::process::id()).as_str())),
    )
}

/// Names this process as the writer of its batches (at most [`WRITER_CHARS_MAX`]
/// characters kept); the first name given, or the default once a batch was written, stays.
pub fn name_writer(name: &str) {
    let name: String = name.chars().take(WRITER_CHARS_MAX).collect();
    let _ = WRITER.set(std::sync::Arc::from(name.as_str()));
}

/// The longest writer name a batch records.
pub const WRITER_CHARS_MAX: usize = 200;

static WRITER: std::sync::OnceLock<std::sync::Arc<str>> = std::sync::OnceLock::new();

/// Where runs and their events live.
pub trait EventStore: Send + Sync + std::fmt::Debug {
    /// Records a new run and its first events (numbered from 1), in one transaction. A run
    /// whose idempotency key another run of its tenant holds, unexpired, is refused with
    /// [`Error::KeyTaken`]; a holder whose claim expired lets the key go in the same
    /// transaction.
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Appends events numbered from `expected_seq` (the run's next number) in one
    /// transaction, and sets the run's listed status.
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected_seq: u64,
        events: Vec<Event>,
        status: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// The run's events with `seq > after`, in order, checked: numbered in a row, each
    /// matching its hash and chained to the one before, the last one matching the run's
    /// `last_seq` and head hash; [`Error::Damaged`] otherwise.
    ///
    /// `load(run, 0)` checks the whole log: it is what a driver folds. `load(run, after)`
    /// checks only the events it returns, chained from the stored hash of event `after`,
    /// and the end of the log: it is for followers, and for watching a run that was loaded
    /// whole before; nothing may be driven from a partial load alone. A follower asking past
    /// the end (`after >= last_seq`) gets nothing.
    fn load<'a>(&'a self, run_id: &'a str, after: u64) -> BoxFuture<'a, Result<Vec<Event>, Error>>;

    /// Which process wrote each commit of a run's log: each batch's first seq and the
    /// writer it recorded ([`writer`]), in order. Batches written before writers were
    /// recorded are left out.
    fn writers<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, String)>, Error>>;

    /// Checks a run's whole log as `load(run, 0)` does (decoding included) and returns where
    /// its chain ends.
    fn verify<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Verified, Error>>;

    /// The run's record.
    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>>;

    /// Stores a tenant's override of a scenario (replacing the one it had), once checked.
    fn put_tenant_override<'a>(&'a self, o: &'a TenantOverride)
    -> BoxFuture<'a, Result<(), Error>>;

    /// The overrides of one tenant, or of every tenant, by tenant and scenario.
    fn tenant_overrides<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TenantOverride>, Error>>;

    /// Removes a tenant's override of a scenario; false when there was none.
    fn remove_tenant_override<'a>(
        &'a self,
        tenant: &'a str,
        scenario_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The run of `tenant` (none: of no tenant) holding this idempotency key unexpired, if
    /// any.
    fn run_by_key<'a>(
        &'a self,
        tenant: Option<&'a str>,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>>;

    /// How many idempotency keys runs of `tenant` (none: of no tenant) hold unexpired,
    /// counted up to `limit` (a bounded read: a count past it is `limit`).
    fn keys_held<'a>(
        &'a self,
        tenant: Option<&'a str>,
        limit: u64,
    ) -> BoxFuture<'a, Result<u64, Error>>;

    /// Every run, newest first, optionally only those with one status.
    fn runs<'a>(&'a self, status: Option<&'a str>) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>>;

    /// A page of the run list. The default reads every run; stores with an index do better.
    fn runs_page<'a>(
        &'a self,
        query: &'a RunQuery,
    ) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        Box::pin(async move {
            let all = self.runs(query.status.as_deref()).await?;
            let start = match &query.after_run {
                Some(id) => all.iter().position(|r| r.run_id == *id).map_or(all.len(), |i| i + 1),
                None => 0,
            };
            Ok(all.into_iter().skip(start).filter(|r| query.admits(r)).take(query.limit).collect())
        })
    }

    /// The records of these runs, in order (`None` for one that does not exist), in one
    /// round trip where the store can (a wave asks after all its workers at once).
    fn runs_named<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<RunRecord>>, Error>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.push(self.run(id).await?);
            }
            Ok(out)
        })
    }

    /// Leases the runnable run (status `running`) due first that nobody holds — or whose
    /// lease expired before `now` — and that `what` admits to `worker` until `until`.
    /// `None` when there is none. This is how several workers share runs: a dead worker's
    /// lease runs out and another claims the run and resumes it from its log. A store
    /// that keeps limits on queues and tenants passes over a run whose queue or tenant has
    /// as many runs leased as its limit, counted under the claim's lock.
    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        what: &'a crate::store::Claimable,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>>;

    /// Extends `worker`'s lease on a run; false when the worker no longer holds it.
    fn renew<'a>(
        &'a self,
        run_id: &'a str,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Gives up `worker`'s lease on a run (nothing happens when it does not hold it).
    fn release<'a>(&'a self, run_id: &'a str, worker: &'a str) -> BoxFuture<'a, Result<(), Error>>;

    /// Marks a run as driven by this process until the guard is dropped; [`Error::Busy`]
    /// while another holds it. A holder that dies lets go (the store's lock must be one
    /// the operating system or the database releases with its holder).
    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>>;

    /// [`EventStore::hold`] for a run this process is about to create under an id no other
    /// process can know yet (a new root run's, from `Engine::new_run_id`): a store may take
    /// the hold in the transaction that creates the run. The default takes it at once.
    fn hold_new<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        self.hold(run_id)
    }

    /// Whether some driver holds the run ([`EventStore::hold`]) right now. Never blocks, and
    /// holds the run itself for no longer than the check: a run whose status is `running`
    /// that nobody holds was interrupted (its driver died) and waits for `baton resume`.
    /// The default takes the hold and lets it go at once.
    fn is_held<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            match self.hold(run_id).await {
                Ok(guard) => {
                    drop(guard);
                    Ok(false)
                }
                Err(Error::Busy(_)) => Ok(true),
                Err(e) => Err(e),
            }
        })
    }

    /// Removes these runs and everything kept of them — record, events, holds and leases —
    /// in one transaction; ids that name no run are passed over. The number removed.
    /// (Which runs may go — ended, whole jobs — is the caller's to decide.)
    fn purge<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<u64, Error>>;

    /// Keeps a scenario version's texts (the JSON of `baton_scenario::Texts`: the canonical
    /// scenario and every file it read) under its checksum, once: true when this call wrote
    /// them; false when that checksum was kept already, whose first copy stays untouched.
    fn put_scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
        scenario_id: &'a str,
        texts: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The texts kept under a scenario version's checksum, if any.
    fn scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Error>>;

    /// The feed: every run's events (only `tenant`'s when given, `Some(None)` only runs of
    /// no tenant) after `after`, at most `limit`, as references in the order they were
    /// committed — each run's in its own order. Nothing committed later ever gets a cursor
    /// at or below one already given (the feed holds back what an unfinished transaction
    /// may still precede), so following it from the last cursor seen misses nothing.
    /// Events come by reference: read them with [`EventStore::load`], which checks them.
    fn feed<'a>(
        &'a self,
        _tenant: &'a Option<Option<String>>,
        _after: FeedCursor,
        _limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FeedRef>, Error>> {
        Box::pin(async { Err(Error::Backend("this store keeps no feed of its events".to_owned())) })
    }

    /// What wakes a waiter when this process appends to the run, for stores that can tell
    /// (a running step then sees a cancel or a steering message at once, without waiting
    /// for its next poll); `None` by default.
    fn notifier<'a>(
        &'a self,
        _run_id: &'a str,
    ) -> BoxFuture<'a, Option<std::sync::Arc<tokio::sync::Notify>>> {
        Box::pin(async { None })
    }

    /// Whether [`EventStore::notifier`] also wakes on other processes' appends (a cancel
    /// or a steering message written by `baton cancel`, the server or another worker):
    /// then a running step looks at the store for them only as a slow safety net.
    fn notices_other_processes(&self) -> bool {
        false
    }

    /// Shares a piece of a model's answer streaming in with other processes' followers,
    /// for stores that carry such pieces between processes: at once, never blocking,
    /// never recorded (the whole answer is, in `model_response`), dropped when it cannot
    /// keep up. Nothing by default.
    fn share_live(&self, _text: &crate::event::LiveText) {}

    /// The pieces of answers other processes share ([`EventStore::share_live`]), for
    /// stores that carry them; `None` by default.
    fn live_from_others(
        &self,
    ) -> BoxFuture<'_, Option<tokio::sync::broadcast::Receiver<crate::event::LiveText>>> {
        Box::pin(async { None })
    }

    /// Resolves once the run has an event numbered above `after`, or after `timeout`;
    /// true when there is one. The default polls; stores that can notify do better.
    fn wait_for_events<'a>(
        &'a self,
        run_id: &'a str,
        after: u64,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                if self.run(run_id).await?.is_some_and(|r| r.last_seq > after) {
                    return Ok(true);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok(false);
                }
                tokio::time::sleep(std::time::Duration::from_millis(50).min(timeout)).await;
            }
        })
    }
}
