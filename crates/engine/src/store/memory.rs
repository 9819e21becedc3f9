//! The in-memory event store: every run a log in a map, for tests and `baton bench`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::chain::{self, Check, Fields, GENESIS, Hash, Payload};
use crate::event::Event;
use crate::future::BoxFuture;

use crate::store::contract::*;
use crate::store::error::Error;

/// Who holds a run, and until when.
#[derive(Clone, Debug, PartialEq)]
struct Lease {
    worker: String,
    until: DateTime<Utc>,
}

/// Whether `run` still holds its idempotency key at `now`.
fn holds(run: &RunRecord, now: DateTime<Utc>) -> bool {
    run.idempotency.as_ref().is_some_and(|c| c.expires_at > now)
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
    /// Each batch's first seq and its writer.
    writers: Vec<(u64, std::sync::Arc<str>)>,
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

    /// The events after `after` with their stored hashes and the hash to check them from,
    /// copied out of the store's lock, and the run's end: what [`checked`] checks.
    fn tail(&self, after: u64) -> Result<Tail, Error> {
        let run_id = &self.record.run_id;
        let (prev, start) = if after == 0 {
            (GENESIS, 0)
        } else {
            match self.events.iter().position(|(e, _)| e.seq == after) {
                Some(i) => (self.events[i].1, i + 1),
                None if after >= self.record.last_seq => {
                    return Ok(Tail {
                        run_id: run_id.clone(),
                        after,
                        prev: self.head,
                        events: Vec::new(),
                        last_seq: after,
                        head: self.head,
                    });
                }
                None => {
                    return Err(
                        Check::new(run_id, after, GENESIS).damaged(after, "the event is missing")
                    );
                }
            }
        };
        Ok(Tail {
            run_id: run_id.clone(),
            after,
            prev,
            events: self.events[start.min(self.events.len())..].to_vec(),
            last_seq: self.record.last_seq,
            head: self.head,
        })
    }
}

/// A run's events as copied out of the store, not yet checked.
struct Tail {
    run_id: String,
    after: u64,
    prev: Hash,
    events: Vec<(Event, Hash)>,
    last_seq: u64,
    head: Hash,
}

impl Tail {
    /// The events, once each is checked against its hash, re-derived from the event as the
    /// store holds it, and the run's end against its record.
    fn checked(self) -> Result<Vec<Event>, Error> {
        let mut check = Check::new(&self.run_id, self.after, self.prev);
        let mut encoded = Vec::with_capacity(512);
        for (event, hash) in &self.events {
            encoded.clear();
            event.data.encode_into(&mut encoded);
            check.event(&Fields::of(event, Payload::Encoded(&encoded)), Some(hash))?;
        }
        check.finish(self.last_seq, Some(&self.head))?;
        Ok(self.events.into_iter().map(|(e, _)| e).collect())
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
    /// The feed: every event's place, written under the runs' lock as it is appended.
    feed: Arc<Mutex<Feed>>,
}

/// Every stored event's place in the feed, in the order they were appended: (position,
/// run id, seq); positions count up from 1 and are never reused.
#[derive(Debug, Default)]
struct Feed {
    places: Vec<(u64, String, u64)>,
    next: u64,
}

impl Feed {
    fn add(&mut self, run_id: &str, events: &[Event]) {
        for e in events {
            self.next += 1;
            self.places.push((self.next, run_id.to_owned(), e.seq));
        }
    }
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
                let removed =
                    run_ids.iter().filter(|id| runs.remove(id.as_str()).is_some()).count() as u64;
                lock(&self.feed).places.retain(|(_, run, _)| runs.contains_key(run));
                removed
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
            // A new run chains from nothing: its hashes are made before the lock is taken.
            let hashes = chain::hashes(GENESIS, &events);
            self.with(|runs| {
                if runs.contains_key(&run.run_id) {
                    return Err(Error::Exists(run.run_id.clone()));
                }
                if let Some(claim) = &run.idempotency {
                    let now = Utc::now();
                    let holder = runs.values_mut().find(|l| {
                        l.record.tenant == run.tenant
                            && l.record.idempotency.as_ref().is_some_and(|c| c.key == claim.key)
                    });
                    if let Some(holder) = holder {
                        if holds(&holder.record, now) {
                            return Err(Error::KeyTaken {
                                key: claim.key.clone(),
                                run_id: holder.record.run_id.clone(),
                            });
                        }
                        holder.record.idempotency = None;
                    }
                }
                check_numbering(&events, 1)?;
                let mut record = run.clone();
                // This store keeps no queues: every one ages as a queue made without a time.
                record.placement.due_at = crate::store::placement::due(
                    run.created_at,
                    run.placement.priority,
                    crate::store::AGING_S_DEFAULT,
                );
                record.last_seq = events.len() as u64;
                if let Some(last) = events.last() {
                    record.updated_at = last.at;
                }
                lock(&self.feed).add(&run.run_id, &events);
                let head = hashes.last().copied().unwrap_or(GENESIS);
                let writers =
                    if events.is_empty() { Vec::new() } else { vec![(1, super::writer())] };
                let events = events.into_iter().zip(hashes).collect();
                runs.insert(run.run_id.clone(), Log { record, events, head, writers });
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
            // The events are encoded and hashed onto the head read first, outside the lock;
            // under it, the hashes are kept when the head is still that one (else another
            // writer got in between: they are made again there, and the check of the
            // expected seq refuses the append anyway).
            let read = self.with(|runs| runs.get(run_id).map(|l| l.head));
            let made = read.map(|head| (head, chain::hashes(head, &events)));
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
                lock(&self.feed).add(run_id, &events);
                let hashes = match made {
                    Some((head, hashes)) if head == log.head => hashes,
                    _ => chain::hashes(log.head, &events),
                };
                log.head = hashes.last().copied().unwrap_or(log.head);
                if !events.is_empty() {
                    log.writers.push((expected_seq, super::writer()));
                }
                log.events.extend(events.into_iter().zip(hashes));
                log.record.last_seq = log.events.len() as u64;
                log.record.status = status.to_owned();
                Ok(())
            })?;
            self.appended.notify_waiters();
            Ok(())
        })
    }

    fn feed<'a>(
        &'a self,
        tenant: &'a Option<Option<String>>,
        after: FeedCursor,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<FeedRef>, Error>> {
        Box::pin(async move {
            Ok(self.with(|runs| {
                let feed = lock(&self.feed);
                let from = feed.places.partition_point(|(pos, ..)| *pos <= after.major);
                feed.places[from..]
                    .iter()
                    .filter(|(_, run, _)| {
                        tenant.as_ref().is_none_or(|t| {
                            runs.get(run.as_str()).is_some_and(|l| l.record.tenant == *t)
                        })
                    })
                    .take(limit)
                    .map(|(pos, run, seq)| FeedRef {
                        cursor: FeedCursor { major: *pos, minor: 0 },
                        run_id: run.clone(),
                        seq: *seq,
                    })
                    .collect()
            }))
        })
    }

    fn load<'a>(&'a self, run_id: &'a str, after: u64) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        Box::pin(async move {
            self.with(|runs| {
                runs.get(run_id).ok_or_else(|| Error::NotFound(run_id.to_owned()))?.tail(after)
            })?
            .checked()
        })
    }

    fn writers<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, String)>, Error>> {
        Box::pin(async move {
            self.with(|runs| {
                let log = runs.get(run_id).ok_or_else(|| Error::NotFound(run_id.to_owned()))?;
                Ok(log.writers.iter().map(|(seq, w)| (*seq, w.to_string())).collect())
            })
        })
    }

    fn verify<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Verified, Error>> {
        Box::pin(async move {
            self.with(|runs| {
                runs.get(run_id).ok_or_else(|| Error::NotFound(run_id.to_owned()))?.tail(0)
            })
            .and_then(|tail| {
                let head = tail.head;
                let events = tail.checked()?;
                Ok(Verified {
                    last_seq: events.last().map_or(0, |e| e.seq),
                    head,
                    form: chain::Form::Encoded,
                })
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

    fn keys_held<'a>(
        &'a self,
        tenant: Option<&'a str>,
        limit: u64,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let now = Utc::now();
            let held = self.with(|runs| {
                runs.values()
                    .filter(|l| l.record.tenant.as_deref() == tenant && holds(&l.record, now))
                    .take(usize::try_from(limit).unwrap_or(usize::MAX))
                    .count()
            });
            Ok(held as u64)
        })
    }

    fn run_by_key<'a>(
        &'a self,
        tenant: Option<&'a str>,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let now = Utc::now();
            Ok(self.with(|runs| {
                runs.values()
                    .find(|l| {
                        l.record.tenant.as_deref() == tenant
                            && l.record.idempotency.as_ref().is_some_and(|c| c.key == key)
                            && holds(&l.record, now)
                    })
                    .map(|l| l.record.clone())
            }))
        })
    }

    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        what: &'a crate::store::Claimable,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        Box::pin(async move {
            let mut leases = lock(&self.leases);
            // A run waits where its job's root does, and only where every workspace of its
            // job is.
            let mut candidates: Vec<RunRecord> = self.with(|runs| {
                let root_of = |r: &RunRecord| r.root_run_id.clone().unwrap_or(r.run_id.clone());
                runs.values()
                    .map(|l| &l.record)
                    .filter(|r| r.status == "running")
                    .filter(|r| {
                        let root = root_of(r);
                        let queue = runs.get(&root).map_or(r.placement.queue.as_str(), |l| {
                            l.record.placement.queue.as_str()
                        });
                        let homes = runs
                            .values()
                            .filter(|l| root_of(&l.record) == root)
                            .filter_map(|l| l.record.placement.home.as_deref());
                        what.admits(queue, homes)
                    })
                    .cloned()
                    .collect()
            });
            let due = |r: &RunRecord| r.placement.due_at.unwrap_or(r.created_at);
            candidates.sort_by(|a, b| due(a).cmp(&due(b)).then(a.run_id.cmp(&b.run_id)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

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
            // The memory store keeps no schema version: its events are typed at today's.
            if matches!(damage, Damage::Version(_)) {
                return false;
            }
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
                Damage::Version(_) => {}
            });
            assert!(found, "run {id} exists");
            true
        };
        conformance::damage_is_detected(&store, "mem", conformance::Links::Events, &edit).await;
    }
}
