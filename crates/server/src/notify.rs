//! A store that wakes the event streams of this process when it appends: [`Notifying`]
//! wraps the server's store, passes every call through, and after each create or append
//! wakes whoever waits on that run's events, so a stream delivers an event as soon as it is
//! committed. Appends by other processes (the CLI on the same database) are still seen: a
//! waiter looks at the store again at least every [`POLL_EVERY`]. It also counts every
//! batch it appends in the [`Metrics`] (read from the events, counted once stored) and times
//! the store's commits; with tracing on, it hands every stored batch to the [`Tracer`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_engine::event::Event;
use baton_engine::model::BoxFuture;
use baton_engine::store::{
    Error, EventStore, RunGuard, RunQuery, RunRecord, TenantOverride, Verified,
};
use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::metrics::{Metrics, Seen};
use crate::traces::Tracer;

/// How often a waiter looks at the store when nothing in this process woke it.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(250);

/// The server's store, waking waiters on its runs' events.
#[derive(Debug)]
pub(crate) struct Notifying {
    inner: Arc<dyn EventStore>,
    waiting: Mutex<HashMap<String, Arc<Notify>>>,
    metrics: Arc<Metrics>,
    tracer: Option<Arc<Tracer>>,
    /// The last events this process appended to each run (a contiguous tail of its log),
    /// so the streams of a run read what was just committed without asking the store.
    recent: Mutex<HashMap<String, std::collections::VecDeque<Event>>>,
}

/// Events kept per run, and runs kept, by [`Notifying::recent`].
const RECENT_PER_RUN: usize = 256;
const RECENT_RUNS: usize = 4_096;

impl Notifying {
    pub(crate) fn new(
        inner: Arc<dyn EventStore>,
        metrics: Arc<Metrics>,
        tracer: Option<Arc<Tracer>>,
    ) -> Self {
        Notifying { inner, waiting: Mutex::default(), metrics, tracer, recent: Mutex::default() }
    }

    /// Keeps a stored batch as the tail of its run's log; a batch that does not follow the
    /// tail (another process appended between) starts the tail again.
    fn remember(&self, run_id: &str, events: &[Event]) {
        let Some(first) = events.first() else { return };
        let mut recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() >= RECENT_RUNS && !recent.contains_key(run_id) {
            recent.clear();
        }
        let tail = recent.entry(run_id.to_owned()).or_default();
        if tail.back().is_some_and(|last| last.seq + 1 != first.seq) {
            tail.clear();
        }
        tail.extend(events.iter().cloned());
        while tail.len() > RECENT_PER_RUN {
            tail.pop_front();
        }
    }

    /// The run's events after `after` from the tail this process appended, when the tail
    /// holds the event after `after`; else none (ask the store).
    pub(crate) fn recent(&self, run_id: &str, after: u64) -> Option<Vec<Event>> {
        let recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tail = recent.get(run_id)?;
        let first = tail.front()?.seq;
        let last = tail.back()?.seq;
        (first <= after + 1 && last > after)
            .then(|| tail.iter().filter(|e| e.seq > after).cloned().collect())
    }

    /// Hands a stored batch to the tracer, first telling it the run's job and scenario
    /// when this process did not see the run start.
    async fn traced(&self, run_id: &str, events: Option<Vec<Event>>) {
        let (Some(tracer), Some(events)) = (&self.tracer, events) else { return };
        let starts = events
            .iter()
            .any(|e| matches!(e.data, baton_engine::event::EventData::ScenarioStarted(_)));
        if !starts
            && !tracer.knows(run_id)
            && let Ok(Some(r)) = self.inner.run(run_id).await
        {
            let root = r.root_run_id.as_deref().unwrap_or(run_id);
            tracer.learn(run_id, root, &r.scenario_id, r.parent_run_id.as_deref());
        }
        tracer.record(run_id, &events);
    }

    /// Counts a stored batch in the metrics.
    async fn counted(&self, run_id: &str, seen: Vec<Seen>, took: std::time::Duration) {
        self.metrics.committed(took);
        let scenario = if self.metrics.wants_scenario(&seen, run_id) {
            self.inner.run(run_id).await.ok().flatten().map(|r| r.scenario_id)
        } else {
            None
        };
        self.metrics.count(seen, scenario.as_deref());
    }

    fn wake(&self, run_id: &str) {
        let waiting = self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = waiting.get(run_id) {
            n.notify_waiters();
        }
    }

    fn waiter(&self, run_id: &str) -> Arc<Notify> {
        let mut waiting = self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Notifiers nobody holds any more are dropped as new ones are made.
        if waiting.len() > 1024 {
            waiting.retain(|_, n| Arc::strong_count(n) > 1);
        }
        Arc::clone(waiting.entry(run_id.to_owned()).or_default())
    }
}

impl EventStore for Notifying {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let seen = self.metrics.read(&run.run_id, &events);
            let traced = self.tracer.is_some().then(|| events.clone());
            let kept = events.clone();
            let began = Instant::now();
            self.inner.create_run(run, events).await?;
            self.remember(&run.run_id, &kept);
            self.wake(&run.run_id);
            self.counted(&run.run_id, seen, began.elapsed()).await;
            self.traced(&run.run_id, traced).await;
            Ok(())
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
            let seen = self.metrics.read(run_id, &events);
            let traced = self.tracer.is_some().then(|| events.clone());
            let kept = events.clone();
            let began = Instant::now();
            self.inner.append(run_id, expected_seq, events, status).await?;
            self.remember(run_id, &kept);
            self.wake(run_id);
            self.counted(run_id, seen, began.elapsed()).await;
            self.traced(run_id, traced).await;
            Ok(())
        })
    }

    fn load<'a>(&'a self, run_id: &'a str, after: u64) -> BoxFuture<'a, Result<Vec<Event>, Error>> {
        self.inner.load(run_id, after)
    }

    fn writers<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<(u64, String)>, Error>> {
        self.inner.writers(run_id)
    }

    fn verify<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Verified, Error>> {
        self.inner.verify(run_id)
    }

    fn run<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        self.inner.run(run_id)
    }

    fn put_tenant_override<'a>(
        &'a self,
        o: &'a TenantOverride,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.put_tenant_override(o)
    }

    fn tenant_overrides<'a>(
        &'a self,
        tenant: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<TenantOverride>, Error>> {
        self.inner.tenant_overrides(tenant)
    }

    fn remove_tenant_override<'a>(
        &'a self,
        tenant: &'a str,
        scenario_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.remove_tenant_override(tenant, scenario_id)
    }

    fn run_by_key<'a>(
        &'a self,
        tenant: Option<&'a str>,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        self.inner.run_by_key(tenant, key)
    }

    fn keys_held<'a>(
        &'a self,
        tenant: Option<&'a str>,
        limit: u64,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        self.inner.keys_held(tenant, limit)
    }

    fn runs<'a>(&'a self, status: Option<&'a str>) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        self.inner.runs(status)
    }

    fn runs_page<'a>(
        &'a self,
        query: &'a RunQuery,
    ) -> BoxFuture<'a, Result<Vec<RunRecord>, Error>> {
        self.inner.runs_page(query)
    }

    fn feed<'a>(
        &'a self,
        tenant: &'a Option<Option<String>>,
        after: baton_engine::store::FeedCursor,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<baton_engine::store::FeedRef>, Error>> {
        self.inner.feed(tenant, after, limit)
    }

    fn runs_named<'a>(
        &'a self,
        ids: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<RunRecord>>, Error>> {
        self.inner.runs_named(ids)
    }

    fn claim<'a>(
        &'a self,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        what: &'a baton_engine::store::Claimable,
    ) -> BoxFuture<'a, Result<Option<RunRecord>, Error>> {
        self.inner.claim(worker, now, until, what)
    }

    fn renew<'a>(
        &'a self,
        run_id: &'a str,
        worker: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(run_id, worker, now, until)
    }

    fn release<'a>(&'a self, run_id: &'a str, worker: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.release(run_id, worker)
    }

    fn hold<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        self.inner.hold(run_id)
    }

    fn hold_new<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<RunGuard, Error>> {
        self.inner.hold_new(run_id)
    }

    fn purge<'a>(&'a self, run_ids: &'a [String]) -> BoxFuture<'a, Result<u64, Error>> {
        self.inner.purge(run_ids)
    }

    fn is_held<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.is_held(run_id)
    }

    fn put_scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
        scenario_id: &'a str,
        texts: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.put_scenario_texts(checksum, scenario_id, texts)
    }

    fn scenario_texts<'a>(
        &'a self,
        checksum: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Error>> {
        self.inner.scenario_texts(checksum)
    }

    /// The store's own notifier where it has one (PostgreSQL's hears every process's
    /// appends, this one's included), else this process's.
    fn notices_other_processes(&self) -> bool {
        self.inner.notices_other_processes()
    }

    fn share_live(&self, text: &baton_engine::cancel::LiveText) {
        self.inner.share_live(text);
    }

    fn live_from_others(
        &self,
    ) -> BoxFuture<'_, Option<tokio::sync::broadcast::Receiver<baton_engine::cancel::LiveText>>>
    {
        self.inner.live_from_others()
    }

    fn notifier<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Option<Arc<Notify>>> {
        Box::pin(async move {
            match self.inner.notifier(run_id).await {
                Some(n) => Some(n),
                None => Some(self.waiter(run_id)),
            }
        })
    }

    /// Waits for this process's appends to the run, and for other processes' where the
    /// store notices them, looking at the store at least every [`POLL_EVERY`] besides.
    fn wait_for_events<'a>(
        &'a self,
        run_id: &'a str,
        after: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let notify = self.waiter(run_id);
            // Where the store's notice covers every process (PostgreSQL), other processes'
            // appends wake the waiter too, not only its next look.
            let others = match self.inner.notices_other_processes() {
                true => self.inner.notifier(run_id).await,
                false => None,
            };
            loop {
                // Registered before the look, so an append between the two is not missed.
                let woken = notify.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let mut heard = others.as_ref().map(|n| Box::pin(n.notified()));
                if let Some(heard) = heard.as_mut() {
                    heard.as_mut().enable();
                }
                if self.inner.run(run_id).await?.is_some_and(|r| r.last_seq > after) {
                    return Ok(true);
                }
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Ok(false);
                }
                let until = deadline.min(now + POLL_EVERY);
                let heard = async {
                    match heard {
                        Some(heard) => heard.await,
                        None => std::future::pending().await,
                    }
                };
                let either = async {
                    tokio::select! {
                        () = woken => {}
                        () = heard => {}
                    }
                };
                let _ = tokio::time::timeout_at(until, either).await;
            }
        })
    }
}
