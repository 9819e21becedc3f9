//! The event store: one trait, an in-memory implementation, and the conformance suite
//! every implementation must pass.
//!
//! An append names the `seq` it expects to write first; a store refuses an append whose
//! expected `seq` is not the run's next one ([`Error::Conflict`]), so two writers can never
//! both advance a run. All events of one append are written together or not at all.
//!
//! Every store keeps each event's hash and the run's head hash ([`crate::chain`]) and
//! checks them when it loads a run: a log that was damaged is refused with
//! [`Error::Damaged`], naming the run and the first bad event, so nothing is folded,
//! driven or appended on top of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::chain::{self, Check, Fields, GENESIS, Hash};
use crate::event::Event;
use crate::model::BoxFuture;

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
    /// The key the job was started with: it names this run and no other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The tenant whose overrides the run's scenario was merged with (the runs it starts
    /// belong to it too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
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

/// What can go wrong in a store.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    #[error(
        "run {run_id}: expected to write event {expected}, but the log is at {actual}; another writer advanced it"
    )]
    Conflict { run_id: String, expected: u64, actual: u64 },
    #[error("no run {0}")]
    NotFound(String),
    #[error("run {0} already exists")]
    Exists(String),
    /// A run was created with this idempotency key already: `run_id` is it.
    #[error("idempotency key {key:?} names run {run_id} already")]
    KeyTaken { key: String, run_id: String },
    #[error("store: {0}")]
    Backend(String),
    /// This process's hold on the run ran out and another process took the run over (this
    /// one stalled longer than a hold lasts): nothing it writes is kept.
    #[error(
        "run {0} was taken over by another process after this one's hold on it ran out (it stalled longer than the hold lasts); nothing was appended — the other process drives it now"
    )]
    Fenced(String),
    #[error(
        "run {0} is being driven by another process; wait for it to pause or end, or stop it with `baton cancel {0}`"
    )]
    Busy(String),
    /// The stored log breaks its sequence or its hash chain: it was changed after it was
    /// written. Nothing may be appended to it or driven from it.
    #[error(
        "run {run_id} is damaged at event {seq}: {problem}; nothing was appended or driven — restore the database from a backup (`baton verify` lists every damaged run)"
    )]
    Damaged { run_id: String, seq: u64, problem: String },
}

/// What a whole-log check found in an intact run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The number of the run's last event (0 for a run without events).
    pub last_seq: u64,
    /// The hash of the run's last event ([`chain::GENESIS`] for a run without events).
    pub head: Hash,
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

/// Where runs and their events live.
pub trait EventStore: Send + Sync + std::fmt::Debug {
    /// Records a new run and its first events (numbered from 1), in one transaction. A run
    /// whose idempotency key names another already is refused with [`Error::KeyTaken`].
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

    /// The run created with this idempotency key, if any.
    fn run_by_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>>;

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

    /// Leases the oldest runnable run (status `running`) that nobody holds — or whose
    /// lease expired before `now` — to `worker` until `until`. `None` when there is none.
    /// This is how several workers share runs: a dead worker's lease runs out and another
    /// claims the run and resumes it from its log.
    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
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

/// Who holds a run, and until when.
#[derive(Clone, Debug, PartialEq)]
struct Lease {
    worker: String,
    until: DateTime<Utc>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// One run in memory: its record, its events with their hashes, and its head hash.
#[derive(Clone, Debug)]
struct Log {
    record: RunRecord,
    events: Vec<(Event, Hash)>,
    head: Hash,
}

impl Log {
    /// Refuses to append to a log whose end does not match its record (the only part an
    /// append relies on; `load` checks the rest).
    fn check_end(&self) -> Result<(), Error> {
        let (seq, hash) = self.events.last().map_or((0, GENESIS), |(e, h)| (e.seq, *h));
        let check = Check::new(&self.record.run_id, seq, hash);
        if self.events.len() as u64 != seq {
            return Err(check.damaged(
                seq,
                format!(
                    "the log holds {} events but its last is numbered {seq}",
                    self.events.len()
                ),
            ));
        }
        check.finish(self.record.last_seq, Some(&self.head)).map(|_| ())
    }

    /// The checked events after `after`.
    fn load(&self, after: u64) -> Result<Vec<Event>, Error> {
        let run_id = &self.record.run_id;
        let (mut check, start) = if after == 0 {
            (Check::new(run_id, 0, GENESIS), 0)
        } else {
            match self.events.iter().position(|(e, _)| e.seq == after) {
                Some(i) => (Check::new(run_id, after, self.events[i].1), i + 1),
                None if after >= self.record.last_seq => return Ok(Vec::new()),
                None => {
                    return Err(
                        Check::new(run_id, after, GENESIS).damaged(after, "the event is missing")
                    );
                }
            }
        };
        let mut out = Vec::with_capacity(self.events.len().saturating_sub(start));
        for (event, hash) in &self.events[start.min(self.events.len())..] {
            let payload = event.data.payload();
            check.event(&Fields::of(event, &payload), Some(hash))?;
            out.push(event.clone());
        }
        check.finish(self.record.last_seq, Some(&self.head))?;
        Ok(out)
    }
}

/// Each run's record and log, by run id.
type Runs = BTreeMap<String, Log>;

/// Runs and events in memory: for tests, benchmarks and one-shot runs.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Runs>>,
    leases: Arc<Mutex<BTreeMap<String, Lease>>>,
    held: Arc<Mutex<std::collections::BTreeSet<String>>>,
    appended: Arc<tokio::sync::Notify>,
    /// Scenario texts by checksum: (scenario id, texts).
    texts: Arc<Mutex<BTreeMap<String, (String, String)>>>,
    /// Tenants' overrides by (tenant, scenario id).
    overrides: Arc<Mutex<BTreeMap<(String, String), TenantOverride>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Runs) -> T) -> T {
        f(&mut lock(&self.inner))
    }

    /// Edits a run's stored events (each with its hash) and record in place, past every
    /// check: for tests that damage a log on purpose. False when there is no such run.
    pub fn damage(
        &self,
        run_id: &str,
        edit: impl FnOnce(&mut Vec<(Event, Hash)>, &mut RunRecord),
    ) -> bool {
        self.with(|runs| {
            runs.get_mut(run_id).map(|log| edit(&mut log.events, &mut log.record)).is_some()
        })
    }
}

impl EventStore for MemoryStore {
    fn put_scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
        scenario_id: &'a str,
        texts: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut kept = lock(&self.texts);
            if kept.contains_key(checksum) {
                return Ok(false);
            }
            kept.insert(checksum.to_owned(), (scenario_id.to_owned(), texts.to_owned()));
            Ok(true)
        })
    }

    fn scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(async move { Ok(lock(&self.texts).get(checksum).map(|(_, t)| t.clone())) })
    }

    fn purge<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let removed = self.with(|runs| {
                run_ids.iter().filter(|id| runs.remove(id.as_str()).is_some()).count() as u64
            });
            let mut leases = lock(&self.leases);
            for id in run_ids {
                leases.remove(id);
            }
            Ok(removed)
        })
    }

    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.with(|runs| {
                if runs.contains_key(&run.run_id) {
                    return Err(Error::Exists(run.run_id.clone()));
                }
                if let Some(key) = &run.idempotency_key
                    && let Some(owner) =
                        runs.values().find(|l| l.record.idempotency_key.as_ref() == Some(key))
                {
                    return Err(Error::KeyTaken {
                        key: key.clone(),
                        run_id: owner.record.run_id.clone(),
                    });
                }
                check_numbering(&events, 1)?;
                let mut record = run.clone();
                record.last_seq = events.len() as u64;
                if let Some(last) = events.last() {
                    record.updated_at = last.at;
                }
                let hashes = chain::hashes(GENESIS, &events);
                let head = hashes.last().copied().unwrap_or(GENESIS);
                let events = events.into_iter().zip(hashes).collect();
                runs.insert(run.run_id.clone(), Log { record, events, head });
                Ok(())
            })
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
            self.with(|runs| {
                let log = runs.get_mut(run_id).ok_or_else(|| Error::NotFound(run_id.to_owned()))?;
                log.check_end()?;
                let actual = log.record.last_seq + 1;
                if actual != expected_seq {
                    return Err(Error::Conflict {
                        run_id: run_id.to_owned(),
                        expected: expected_seq,
                        actual,
                    });
                }
                check_numbering(&events, expected_seq)?;
                if let Some(last) = events.last() {
                    log.record.updated_at = last.at;
                }
                let hashes = chain::hashes(log.head, &events);
                log.head = hashes.last().copied().unwrap_or(log.head);
                log.events.extend(events.into_iter().zip(hashes));
                log.record.last_seq = log.events.len() as u64;
                log.record.status = status.to_owned();
                Ok(())
            })?;
            self.appended.notify_waiters();
            Ok(())
        })
    }

    fn load<'a>(&'a self, run_id: &'a str, after: u64) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move {
            self.with(|runs| {
                runs.get(run_id).ok_or_else(|| Error::NotFound(run_id.to_owned()))?.load(after)
            })
        })
    }

    fn verify<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Verified, Error>> {
        Box::pin(async move {
            self.with(|runs| {
                let log = runs.get(run_id).ok_or_else(|| Error::NotFound(run_id.to_owned()))?;
                let events = log.load(0)?;
                Ok(Verified { last_seq: events.last().map_or(0, |e| e.seq), head: log.head })
            })
        })
    }

    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move { Ok(self.with(|runs| runs.get(run_id).map(|l| l.record.clone()))) })
    }

    fn put_tenant_override<'a>(
        &'a self,
        o: &'a TenantOverride,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            lock(&self.overrides).insert((o.tenant.clone(), o.scenario_id.clone()), o.clone());
            Ok(())
        })
    }

    fn tenant_overrides<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TenantOverride>, Error>> {
        Box::pin(async move {
            Ok(lock(&self.overrides)
                .values()
                .filter(|o| tenant.is_none_or(|t| t == o.tenant))
                .cloned()
                .collect())
        })
    }

    fn remove_tenant_override<'a>(
        &'a self,
        tenant: &'a str,
        scenario_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            Ok(lock(&self.overrides).remove(&(tenant.to_owned(), scenario_id.to_owned())).is_some())
        })
    }

    fn run_by_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            Ok(self.with(|runs| {
                runs.values()
                    .find(|l| l.record.idempotency_key.as_deref() == Some(key))
                    .map(|l| l.record.clone())
            }))
        })
    }

    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let mut leases = lock(&self.leases);
            let mut candidates: Vec<RunRecord> = self.with(|runs| {
                runs.values().map(|l| l.record.clone()).filter(|r| r.status == "running").collect()
            });
            candidates
                .sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.run_id.cmp(&b.run_id)));
            let free = candidates
                .into_iter()
                .find(|r| leases.get(&r.run_id).is_none_or(|l| l.until < now));
            if let Some(run) = &free {
                leases.insert(run.run_id.clone(), Lease { worker: worker.to_owned(), until });
            }
            Ok(free)
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
            let mut leases = lock(&self.leases);
            match leases.get_mut(run_id) {
                Some(l) if l.worker == worker && l.until >= now => {
                    l.until = until;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }

    fn release<'a>(&'a self, run_id: &'a str, worker: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut leases = lock(&self.leases);
            if leases.get(run_id).is_some_and(|l| l.worker == worker) {
                leases.remove(run_id);
            }
            Ok(())
        })
    }

    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        /// Lets go of the run when dropped.
        struct Held(Arc<Mutex<std::collections::BTreeSet<String>>>, String);
        impl Drop for Held {
            fn drop(&mut self) {
                lock(&self.0).remove(&self.1);
            }
        }
        Box::pin(async move {
            if !lock(&self.held).insert(run_id.to_owned()) {
                return Err(Error::Busy(run_id.to_owned()));
            }
            Ok(RunGuard::new(Held(Arc::clone(&self.held), run_id.to_owned())))
        })
    }

    fn wait_for_events<'a>(
        &'a self,
        run_id: &'a str,
        after: u64,
        timeout: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let notified = self.appended.notified();
                let last = self.with(|runs| runs.get(run_id).map(|l| l.record.last_seq));
                match last {
                    None => return Err(Error::NotFound(run_id.to_owned())),
                    Some(last) if last > after => return Ok(true),
                    Some(_) => {}
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Ok(false);
                }
            }
        })
    }

    fn runs<'a>(&'a self, status: Option<&'a str>) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        Box::pin(async move {
            let mut list: Vec<RunRecord> = self.with(|runs| {
                runs.values()
                    .map(|l| l.record.clone())
                    .filter(|r| status.is_none_or(|s| r.status == s))
                    .collect()
            });
            list.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.run_id.cmp(&a.run_id)));
            Ok(list)
        })
    }
}

/// The conformance suite: every [`EventStore`] implementation runs these checks in its
/// own tests. Each function panics with a message on a violation.
pub mod conformance {
    use chrono::{TimeZone, Utc};

    use super::{Error, EventStore, RunRecord};
    use crate::chain::{self, GENESIS};
    use crate::event::{Event, EventData, NewEvent, Warning};

    fn record(id: &str) -> RunRecord {
        let at = Utc.timestamp_opt(1_700_000_000, 0).single().unwrap_or_default();
        RunRecord {
            run_id: id.to_owned(),
            scenario_id: "demo".to_owned(),
            status: "running".to_owned(),
            created_at: at,
            updated_at: at,
            last_seq: 0,
            parent_run_id: None,
            root_run_id: None,
            idempotency_key: None,
            tenant: None,
        }
    }

    fn events(from: u64, n: u64) -> Vec<Event> {
        let at = Utc.timestamp_opt(1_700_000_000, 0).single().unwrap_or_default();
        (from..from + n)
            .map(|seq| {
                NewEvent::level(
                    "l1",
                    1,
                    EventData::Warning(Warning { message: format!("event {seq}") }),
                )
                .at(seq, at)
            })
            .collect()
    }

    /// Runs every check against a store with no runs whose ids start with `prefix`.
    pub async fn run_all(store: &dyn EventStore, prefix: &str) {
        append_and_load(store, &format!("{prefix}-a")).await;
        expected_seq_is_enforced(store, &format!("{prefix}-b")).await;
        a_batch_is_all_or_nothing(store, &format!("{prefix}-c")).await;
        a_run_is_created_with_its_first_events(store, &format!("{prefix}-d")).await;
        unknown_runs_are_reported(store, &format!("{prefix}-missing")).await;
        runs_are_listed_by_status(store, prefix).await;
        leases_share_runs_between_workers(store, prefix).await;
        one_driver_at_a_time(store, &format!("{prefix}-h")).await;
        waiting_for_events(store, &format!("{prefix}-w")).await;
        the_chain_is_the_engines(store, &format!("{prefix}-chain")).await;
        scenario_texts_are_kept_once(store, prefix).await;
        runs_keep_their_links_and_keys(store, prefix).await;
        tenant_overrides_are_kept_per_tenant_and_scenario(store, prefix).await;
        runs_are_paged_newest_first_by_tenant(store, prefix).await;
        purged_runs_are_gone(store, prefix).await;
    }

    /// A purged run is gone — its record, its events, its key — and runs not named stay.
    async fn purged_runs_are_gone(store: &dyn EventStore, prefix: &str) {
        let (gone, kept) = (format!("{prefix}-purged"), format!("{prefix}-kept"));
        let mut keyed = record(&gone);
        keyed.idempotency_key = Some(format!("{prefix}-purged-key"));
        store.create_run(&keyed, events(1, 3)).await.expect("create");
        store.create_run(&record(&kept), events(1, 2)).await.expect("create");
        let removed =
            store.purge(&[gone.clone(), format!("{prefix}-never-was")]).await.expect("purge");
        assert_eq!(removed, 1, "one run named exists");
        assert_eq!(store.run(&gone).await.expect("run"), None);
        assert!(matches!(store.load(&gone, 0).await, Err(Error::NotFound(_))));
        assert_eq!(store.run_by_key(&format!("{prefix}-purged-key")).await.expect("key"), None);
        assert_eq!(store.load(&kept, 0).await.expect("the other run stays").len(), 2);
        // The id may be used again: nothing of the old run is left to clash with.
        store.create_run(&record(&gone), events(1, 1)).await.expect("create again");
        assert_eq!(store.load(&gone, 0).await.expect("load").len(), 1);
    }

    /// Pages of one tenant's runs follow each other newest first with no run twice or
    /// missing; filters by scenario and roots hold; other tenants' runs never appear.
    async fn runs_are_paged_newest_first_by_tenant(store: &dyn EventStore, prefix: &str) {
        let tenant = format!("{prefix}-pages");
        let base = Utc.timestamp_opt(1_750_000_000, 0).single().unwrap_or_default();
        let mut made = Vec::new();
        for i in 0..5i64 {
            let mut r = record(&format!("{prefix}-page-{i}"));
            r.created_at = base + chrono::Duration::seconds(i);
            r.tenant = Some(tenant.clone());
            if i == 3 {
                r.scenario_id = "other".to_owned();
                r.parent_run_id = Some(format!("{prefix}-page-0"));
                r.root_run_id = Some(format!("{prefix}-page-0"));
            }
            store.create_run(&r, events(1, 1)).await.expect("create a run");
            made.push(r.run_id);
        }
        let mut intruder = record(&format!("{prefix}-page-x"));
        intruder.created_at = base + chrono::Duration::seconds(2);
        intruder.tenant = Some(format!("{prefix}-others"));
        store.create_run(&intruder, events(1, 1)).await.expect("create another tenant's run");
        let mut query = super::RunQuery {
            tenant: Some(Some(tenant.clone())),
            limit: 2,
            ..super::RunQuery::default()
        };
        let mut seen = Vec::new();
        for _ in 0..4 {
            let page = store.runs_page(&query).await.expect("a page");
            assert!(page.len() <= 2, "a page holds at most its limit");
            let Some(last) = page.last() else { break };
            query.after_run = Some(last.run_id.clone());
            seen.extend(page.into_iter().map(|r| r.run_id));
        }
        made.reverse();
        assert_eq!(seen, made, "pages of tenant {tenant}, newest first");
        let only = |q: super::RunQuery| async move {
            let page = store.runs_page(&q).await.expect("a page");
            page.into_iter().map(|r| r.run_id).collect::<Vec<_>>()
        };
        let scenario = super::RunQuery {
            tenant: Some(Some(tenant.clone())),
            scenario_id: Some("other".to_owned()),
            limit: 10,
            ..super::RunQuery::default()
        };
        assert_eq!(only(scenario).await, vec![format!("{prefix}-page-3")]);
        let roots = super::RunQuery {
            tenant: Some(Some(tenant.clone())),
            roots_only: true,
            limit: 10,
            ..super::RunQuery::default()
        };
        assert_eq!(only(roots).await.len(), 4, "the child run is not a root");
    }

    /// A child's record names its parent and root and a tenant; an idempotency key names
    /// one run, and a second run with it is refused naming the first.
    async fn runs_keep_their_links_and_keys(store: &dyn EventStore, prefix: &str) {
        let root = format!("{prefix}-root");
        let key = format!("{prefix}-key");
        let mut first = record(&root);
        first.idempotency_key = Some(key.clone());
        first.tenant = Some("acme".to_owned());
        store.create_run(&first, events(1, 1)).await.expect("create a root");
        let mut child = record(&format!("{prefix}-child"));
        child.parent_run_id = Some(root.clone());
        child.root_run_id = Some(root.clone());
        child.tenant = Some("acme".to_owned());
        store.create_run(&child, events(1, 1)).await.expect("create a child");
        let read = store.run(&child.run_id).await.expect("read").expect("the child");
        assert_eq!(read.parent_run_id.as_deref(), Some(root.as_str()));
        assert_eq!(read.root_run_id.as_deref(), Some(root.as_str()));
        assert_eq!(read.tenant.as_deref(), Some("acme"));
        let found = store.run_by_key(&key).await.expect("by key").expect("the root");
        assert_eq!((found.run_id.as_str(), found.tenant.as_deref()), (root.as_str(), Some("acme")));
        assert_eq!(store.run_by_key(&format!("{prefix}-nokey")).await.expect("by key"), None);
        let mut second = record(&format!("{prefix}-again"));
        second.idempotency_key = Some(key.clone());
        match store.create_run(&second, events(1, 1)).await {
            Err(Error::KeyTaken { run_id, .. }) => assert_eq!(run_id, root),
            other => panic!("a second run with key {key} must be refused, got {other:?}"),
        }
        assert_eq!(store.run(&second.run_id).await.expect("read"), None);
    }

    /// Overrides are stored per tenant and scenario, replaced by a later one, listed by
    /// tenant and removed.
    async fn tenant_overrides_are_kept_per_tenant_and_scenario(
        store: &dyn EventStore,
        prefix: &str,
    ) {
        let at = Utc.timestamp_opt(1_700_000_000, 0).single().unwrap_or_default();
        let tenant = format!("{prefix}-t");
        let other = format!("{prefix}-u");
        let o = |tenant: &str, scenario: &str, yaml: &str| super::TenantOverride {
            tenant: tenant.to_owned(),
            scenario_id: scenario.to_owned(),
            yaml: yaml.to_owned(),
            updated_at: at,
        };
        store.put_tenant_override(&o(&tenant, "qa", "a: 1\n")).await.expect("put");
        store.put_tenant_override(&o(&tenant, "qa", "a: 2\n")).await.expect("put");
        store.put_tenant_override(&o(&tenant, "build", "b: 1\n")).await.expect("put");
        store.put_tenant_override(&o(&other, "qa", "c: 1\n")).await.expect("put");
        let mine = store.tenant_overrides(Some(&tenant)).await.expect("list");
        let got: Vec<(&str, &str)> =
            mine.iter().map(|o| (o.scenario_id.as_str(), o.yaml.as_str())).collect();
        assert_eq!(got, [("build", "b: 1\n"), ("qa", "a: 2\n")]);
        assert!(store.tenant_overrides(None).await.expect("list").len() >= 3);
        assert!(store.remove_tenant_override(&tenant, "qa").await.expect("remove"));
        assert!(!store.remove_tenant_override(&tenant, "qa").await.expect("remove"));
        assert_eq!(store.tenant_overrides(Some(&tenant)).await.expect("list").len(), 1);
        assert_eq!(store.tenant_overrides(Some(&other)).await.expect("list").len(), 1);
    }

    /// A scenario version's texts are kept under its checksum by the first writer; a
    /// second write of the same checksum changes nothing and says so.
    async fn scenario_texts_are_kept_once(store: &dyn EventStore, prefix: &str) {
        let sum = format!("{prefix}-sum");
        assert_eq!(store.scenario_texts(&sum).await.expect("scenario texts"), None);
        assert!(
            store.put_scenario_texts(&sum, "qa", "{\"first\":1}").await.expect("scenario texts")
        );
        assert!(
            !store.put_scenario_texts(&sum, "qa", "{\"second\":2}").await.expect("scenario texts")
        );
        assert_eq!(
            store.scenario_texts(&sum).await.expect("scenario texts").as_deref(),
            Some("{\"first\":1}")
        );
        let other = format!("{prefix}-other");
        assert!(store.put_scenario_texts(&other, "qa", "{}").await.expect("scenario texts"));
        assert_eq!(
            store.scenario_texts(&other).await.expect("scenario texts").as_deref(),
            Some("{}")
        );
        assert_eq!(
            store.scenario_texts(&sum).await.expect("scenario texts").as_deref(),
            Some("{\"first\":1}")
        );
    }

    /// One edit of a stored log, as a bad disk, a careless hand or a bug in a store makes
    /// it. Each store's tests apply it to their own storage, past the store's checks.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Damage {
        /// Event `n` is deleted.
        Delete(u64),
        /// Events `a` and `b` trade places (each takes the other's number).
        Swap(u64, u64),
        /// Event `n`'s payload is changed (its content, not only its layout).
        Payload(u64),
        /// Event `n` is renumbered to `m` (past the end of the log).
        Renumber(u64, u64),
        /// Event `n`'s time moves by a second.
        Time(u64),
        /// Event `n`'s kind is changed to `heartbeat`.
        Kind(u64),
        /// Event `n`'s level id is changed.
        Level(u64),
        /// Event `n`'s attempt is changed.
        Attempt(u64),
        /// Event `n`'s stored hash is changed.
        Hash(u64),
        /// The run's `last_seq` is set to `n`, events untouched.
        LastSeq(u64),
        /// Every event after `n` is deleted and `last_seq` set to `n`: only the head hash
        /// tells.
        Truncate(u64),
    }

    impl Damage {
        /// Every kind of damage to a log of [`DAMAGED_LOG_LEN`] events, with the first bad
        /// event each must be reported at.
        pub fn all() -> Vec<(Damage, u64)> {
            vec![
                (Damage::Delete(3), 3),
                (Damage::Delete(DAMAGED_LOG_LEN), DAMAGED_LOG_LEN),
                (Damage::Swap(2, 4), 2),
                (Damage::Payload(3), 3),
                (Damage::Renumber(3, 9), 3),
                (Damage::Time(3), 3),
                (Damage::Kind(3), 3),
                (Damage::Level(3), 3),
                (Damage::Attempt(3), 3),
                (Damage::Hash(3), 3),
                (Damage::LastSeq(DAMAGED_LOG_LEN + 2), DAMAGED_LOG_LEN + 1),
                (Damage::LastSeq(DAMAGED_LOG_LEN - 1), DAMAGED_LOG_LEN),
                (Damage::Truncate(3), 4),
            ]
        }
    }

    /// Events in each run [`damage_is_detected`] damages.
    pub const DAMAGED_LOG_LEN: u64 = 5;

    /// What a store's hashes link: every event, or each commit batch (then damage is
    /// reported at the first event of the first batch whose hash no longer holds). The
    /// damaged runs are written as two batches: events 1–2, then 3 to the end.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Links {
        Events,
        Batches,
    }

    impl Links {
        /// The case of [`Damage::all`] as it applies to such a store: the damage, and where
        /// it is reported. A batch's hash vouches for all of its events at once, so a cut
        /// of the log is made at the end of a batch (a cut inside one is found by a load,
        /// not by the cheap look at the end an append takes).
        fn case(self, damage: Damage, seq: u64) -> (Damage, u64) {
            match (self, damage) {
                (Links::Events, d) | (Links::Batches, d @ Damage::LastSeq(_)) => (d, seq),
                (Links::Batches, Damage::Truncate(_)) => (Damage::Truncate(2), 3),
                (Links::Batches, d) if seq <= 2 => (d, 1),
                (Links::Batches, d) => (d, seq.min(3)),
            }
        }
    }

    /// Damages one fresh run per kind of [`Damage`] with `edit` (which changes the store's
    /// storage directly, given the run id) and checks that loading, verifying and appending
    /// all refuse, naming the run and the first bad event.
    pub async fn damage_is_detected(
        store: &dyn EventStore,
        prefix: &str,
        links: Links,
        edit: &(dyn Fn(&str, Damage) + Sync),
    ) {
        for (i, (damage, first_bad)) in Damage::all().into_iter().enumerate() {
            let (damage, first_bad) = links.case(damage, first_bad);
            let id = format!("{prefix}-damage-{i}");
            store.create_run(&record(&id), events(1, 2)).await.expect("create");
            store.append(&id, 3, events(3, DAMAGED_LOG_LEN - 2), "paused").await.expect("append");
            store.load(&id, 0).await.expect("an intact log loads");
            edit(&id, damage);
            let refused = |what: &str, got: Result<(), Error>| match got {
                Err(Error::Damaged { run_id, seq, problem }) => {
                    assert_eq!(run_id, id, "{damage:?}: {what} names the run");
                    assert_eq!(
                        seq, first_bad,
                        "{damage:?}: {what} names the first bad event ({problem})"
                    );
                }
                other => panic!("{damage:?}: {what} must refuse a damaged log, got {other:?}"),
            };
            refused("a whole load", store.load(&id, 0).await.map(|_| ()));
            refused("verify", store.verify(&id).await.map(|_| ()));
            refused("a load after event 1", store.load(&id, 1).await.map(|_| ()));
            let before = store.run(&id).await.expect("run").expect("exists");
            if matches!(
                damage,
                Damage::LastSeq(_) | Damage::Truncate(_) | Damage::Delete(DAMAGED_LOG_LEN)
            ) {
                // The end of the log is what an append builds on: it refuses there too.
                let next = before.last_seq + 1;
                let got = store.append(&id, next, events(next, 1), "running").await;
                assert!(
                    matches!(&got, Err(Error::Damaged { run_id, .. }) if *run_id == id),
                    "{damage:?}: an append on a damaged end must refuse, got {got:?}"
                );
                let after = store.run(&id).await.expect("run").expect("exists");
                assert_eq!(after.last_seq, before.last_seq, "{damage:?}: nothing was appended");
            }
        }
    }

    /// The chain a store keeps is the engine's, over the logical form of the events: two
    /// stores holding the same events hold the same hashes.
    async fn the_chain_is_the_engines(store: &dyn EventStore, id: &str) {
        store.create_run(&record(id), Vec::new()).await.expect("create");
        let empty = store.verify(id).await.expect("an empty run is intact");
        assert_eq!((empty.last_seq, empty.head), (0, GENESIS));
        store.append(id, 1, events(1, 2), "running").await.expect("append");
        store.append(id, 3, events(3, 3), "running").await.expect("append");
        let verified = store.verify(id).await.expect("an intact run verifies");
        let expected = chain::hashes(GENESIS, &events(1, 5));
        assert_eq!(verified.last_seq, 5);
        assert_eq!(
            chain::hex(&verified.head),
            chain::hex(&expected[4]),
            "the head is the engine's hash of the last event"
        );
        assert_eq!(store.load(id, 2).await.expect("partial load"), events(3, 3));
        assert_eq!(store.load(id, 5).await.expect("load at the end"), Vec::new());
        assert_eq!(store.load(id, 9).await.expect("load past the end"), Vec::new());
    }

    async fn one_driver_at_a_time(store: &dyn EventStore, run_id: &str) {
        assert!(!store.is_held(run_id).await.expect("is_held"), "nobody holds a new run");
        let first = store.hold(run_id).await.expect("a free run can be held");
        assert!(store.is_held(run_id).await.expect("is_held"), "a held run is held");
        assert!(store.is_held(run_id).await.expect("is_held"), "asking does not let go");
        match store.hold(run_id).await {
            Err(Error::Busy(id)) => assert_eq!(id, run_id),
            other => panic!("a held run is busy, got {other:?}"),
        }
        let other = store.hold(&format!("{run_id}-other")).await.expect("other runs are free");
        drop(first);
        assert!(!store.is_held(run_id).await.expect("is_held"), "a dropped guard lets go");
        let again = store.hold(run_id).await.expect("a run is free once its guard is dropped");
        drop((again, other));
    }

    async fn leases_share_runs_between_workers(store: &dyn EventStore, prefix: &str) {
        use chrono::Duration;
        // Only runs whose status is `running` can be claimed; take every one there is.
        let t0 = Utc.timestamp_opt(1_800_000_000, 0).single().unwrap_or_default();
        let mut claimed = Vec::new();
        while let Some(run) =
            store.claim("w1", t0, t0 + Duration::seconds(30)).await.expect("claim")
        {
            assert!(!claimed.contains(&run.run_id), "a run is leased once");
            assert_eq!(run.status, "running");
            claimed.push(run.run_id);
            assert!(claimed.len() < 1000, "claim must run out of runs");
        }
        assert!(claimed.iter().any(|id| id.starts_with(prefix)), "{claimed:?}");
        let mine = &claimed[0];
        assert!(
            store
                .claim("w2", t0 + Duration::seconds(10), t0 + Duration::seconds(40))
                .await
                .expect("claim")
                .is_none(),
            "leased runs are not claimable"
        );
        assert!(
            store
                .renew(mine, "w1", t0 + Duration::seconds(20), t0 + Duration::seconds(60))
                .await
                .expect("renew")
        );
        assert!(
            !store
                .renew(mine, "w2", t0 + Duration::seconds(20), t0 + Duration::seconds(60))
                .await
                .expect("renew"),
            "only the holder renews"
        );
        // After the lease runs out, another worker takes the run over.
        let later = t0 + Duration::seconds(61);
        let taken = store
            .claim("w2", later, later + Duration::seconds(30))
            .await
            .expect("claim")
            .expect("an expired lease frees the run");
        assert!(
            !store
                .renew(&taken.run_id, "w1", later, later + Duration::seconds(30))
                .await
                .expect("renew"),
            "a lost lease cannot be renewed"
        );
        store.release(&taken.run_id, "w2").await.expect("release");
        let again = store.claim("w3", later, later + Duration::seconds(30)).await.expect("claim");
        assert_eq!(
            again.map(|r| r.run_id),
            Some(taken.run_id),
            "a released run is claimable at once"
        );
    }

    async fn waiting_for_events(store: &dyn EventStore, id: &str) {
        store.create_run(&record(id), events(1, 1)).await.expect("create");
        let quiet =
            store.wait_for_events(id, 1, std::time::Duration::from_millis(60)).await.expect("wait");
        assert!(!quiet, "no new event: the wait times out");
        store.append(id, 2, events(2, 1), "running").await.expect("append");
        assert!(
            store.wait_for_events(id, 1, std::time::Duration::from_secs(5)).await.expect("wait")
        );
    }

    /// Checks, on a store reopened after [`run_all`], that every committed event is there.
    pub async fn reopened(store: &dyn EventStore, prefix: &str) {
        let id = format!("{prefix}-a");
        let all = store.load(&id, 0).await.expect("load after reopening");
        assert_eq!(
            all,
            [events(1, 3), events(4, 2)].concat(),
            "a reopened store keeps every event"
        );
        assert_eq!(store.run(&id).await.expect("run").expect("run exists").status, "paused");
        let chained = store.verify(&format!("{prefix}-chain")).await.expect("verify");
        let expected = chain::hashes(GENESIS, &events(1, 5));
        assert_eq!(chained.head, expected[4], "a reopened store keeps the head hash");
    }

    async fn append_and_load(store: &dyn EventStore, id: &str) {
        store.create_run(&record(id), Vec::new()).await.expect("create run");
        assert!(
            matches!(store.create_run(&record(id), Vec::new()).await, Err(Error::Exists(_))),
            "a second create must fail"
        );
        store.append(id, 1, events(1, 3), "running").await.expect("append 1..=3");
        store.append(id, 4, events(4, 2), "paused").await.expect("append 4..=5");
        let all = store.load(id, 0).await.expect("load");
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!(all, [events(1, 3), events(4, 2)].concat(), "events come back as written");
        let tail = store.load(id, 3).await.expect("load tail");
        assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
        let run = store.run(id).await.expect("run").expect("run exists");
        assert_eq!((run.last_seq, run.status.as_str()), (5, "paused"));
    }

    async fn expected_seq_is_enforced(store: &dyn EventStore, id: &str) {
        store.create_run(&record(id), Vec::new()).await.expect("create run");
        store.append(id, 1, events(1, 2), "running").await.expect("append");
        let stale = store.append(id, 2, events(2, 1), "running").await;
        assert!(
            matches!(stale, Err(Error::Conflict { expected: 2, actual: 3, .. })),
            "stale append: {stale:?}"
        );
        let ahead = store.append(id, 5, events(5, 1), "running").await;
        assert!(matches!(ahead, Err(Error::Conflict { .. })), "append past the end: {ahead:?}");
        assert_eq!(store.load(id, 0).await.expect("load").len(), 2);
    }

    async fn a_batch_is_all_or_nothing(store: &dyn EventStore, id: &str) {
        store.create_run(&record(id), Vec::new()).await.expect("create run");
        let mut bad = events(1, 3);
        bad[2].seq = 9;
        assert!(
            store.append(id, 1, bad, "running").await.is_err(),
            "a misnumbered batch must fail"
        );
        assert!(
            store.load(id, 0).await.expect("load").is_empty(),
            "nothing of a failed batch is kept"
        );
    }

    async fn a_run_is_created_with_its_first_events(store: &dyn EventStore, id: &str) {
        store.create_run(&record(id), events(1, 2)).await.expect("create with events");
        assert_eq!(store.load(id, 0).await.expect("load"), events(1, 2));
        assert_eq!(store.run(id).await.expect("run").expect("exists").last_seq, 2);
        store.append(id, 3, events(3, 1), "running").await.expect("append after");
        let other = format!("{id}-bad");
        assert!(
            store.create_run(&record(&other), events(2, 1)).await.is_err(),
            "first events start at 1"
        );
        assert!(store.run(&other).await.expect("run").is_none(), "a failed create leaves no run");
    }

    async fn unknown_runs_are_reported(store: &dyn EventStore, id: &str) {
        assert!(matches!(
            store.append(id, 1, events(1, 1), "running").await,
            Err(Error::NotFound(_))
        ));
        assert!(store.run(id).await.expect("run").is_none());
        // A load of a run that does not exist says so: the engine reads a run's state by
        // loading it, without asking for it first.
        assert!(matches!(store.load(id, 0).await, Err(Error::NotFound(_))));
    }

    async fn runs_are_listed_by_status(store: &dyn EventStore, prefix: &str) {
        let paused = store.runs(Some("paused")).await.expect("list");
        assert!(paused.iter().any(|r| r.run_id == format!("{prefix}-a")));
        assert!(paused.iter().all(|r| r.status == "paused"));
        let all = store.runs(None).await.expect("list");
        assert!(all.len() >= 3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_store_conforms() {
        conformance::run_all(&MemoryStore::new(), "mem").await;
    }

    #[tokio::test]
    async fn memory_store_detects_damage() {
        use crate::event::{EventData, Warning};
        use conformance::Damage;
        let store = MemoryStore::new();
        let edit = |id: &str, damage: Damage| {
            let index = |n: u64| usize::try_from(n - 1).expect("small");
            let found = store.damage(id, |events, record| match damage {
                Damage::Delete(n) => {
                    events.remove(index(n));
                }
                Damage::Swap(a, b) => {
                    events.swap(index(a), index(b));
                    events[index(a)].0.seq = a;
                    events[index(b)].0.seq = b;
                }
                Damage::Payload(n) => {
                    events[index(n)].0.data =
                        EventData::Warning(Warning { message: "edited".to_owned() });
                }
                Damage::Renumber(n, m) => events[index(n)].0.seq = m,
                Damage::Time(n) => events[index(n)].0.at += chrono::Duration::seconds(1),
                Damage::Kind(n) => {
                    events[index(n)].0.data = EventData::decode_str(
                        "heartbeat",
                        crate::event::VERSION,
                        r#"{"elapsed_ms": 0}"#,
                    )
                    .expect("a heartbeat");
                }
                Damage::Level(n) => events[index(n)].0.level_id = Some("other".to_owned()),
                Damage::Attempt(n) => events[index(n)].0.attempt = Some(9),
                Damage::Hash(n) => events[index(n)].1[0] ^= 1,
                Damage::LastSeq(n) => record.last_seq = n,
                Damage::Truncate(n) => {
                    events.truncate(index(n + 1));
                    record.last_seq = n;
                }
            });
            assert!(found, "run {id} exists");
        };
        conformance::damage_is_detected(&store, "mem", conformance::Links::Events, &edit).await;
    }
}
