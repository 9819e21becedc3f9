//! The embedded workers' own state, which the application state holds: the slots (at most
//! [`crate::settings::Settings::workers`] drives at once), the jobs being driven or waiting
//! for a slot (each marked when asked again meanwhile), the queue's length and the approval
//! deadlines already waited for. What drives a job is in `workers`, above the application
//! state it needs.

#![allow(clippy::print_stderr)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_engine::cancel::CancelToken;
use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};

/// How long a stopping server waits for its drives to stop.
const DRAIN_FOR: Duration = Duration::from_secs(60);

/// The drives of this server.
#[derive(Debug)]
pub(crate) struct Workers {
    /// The command that drives, for its notes on stderr (`baton serve`, `baton mcp`).
    name: &'static str,
    slots: Arc<Semaphore>,
    /// How many slots there are.
    size: u32,
    /// Jobs being driven or waiting for a slot, by root run; `true` when asked again
    /// meanwhile.
    active: Mutex<HashMap<String, bool>>,
    /// Jobs waiting for a slot.
    queued: AtomicUsize,
    changed: Notify,
    /// Approval deadlines already waited for, by run and request.
    timers: Mutex<HashSet<(String, String)>>,
}

impl Workers {
    pub(crate) fn new(name: &'static str, slots: usize) -> Self {
        Workers {
            name,
            slots: Arc::new(Semaphore::new(slots.max(1))),
            size: u32::try_from(slots.max(1)).unwrap_or(u32::MAX),
            active: Mutex::default(),
            queued: AtomicUsize::new(0),
            changed: Notify::new(),
            timers: Mutex::default(),
        }
    }

    /// The command that drives, for its notes on stderr.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Jobs waiting for a worker.
    pub(crate) fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Slots free now.
    pub(crate) fn free(&self) -> usize {
        self.slots.available_permits()
    }

    /// Jobs being driven or waiting to be.
    pub(crate) fn active(&self) -> usize {
        self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// A free slot, once there is one; held as long as the permit lives.
    pub(crate) async fn slot(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        Arc::clone(&self.slots).acquire_owned().await
    }

    /// Counts a job that waits for a slot.
    pub(crate) fn queue_one(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a job that stopped waiting for a slot.
    pub(crate) fn dequeue_one(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// Marks the job whose root is `run_id` as driven here; false when it is already (it
    /// is then driven once more after the drive under way).
    pub(crate) fn enter(&self, run_id: &str) -> bool {
        let mut active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(again) = active.get_mut(run_id) {
            *again = true;
            return false;
        }
        active.insert(run_id.to_owned(), false);
        true
    }

    pub(crate) fn leave(&self, run_id: &str) {
        self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(run_id);
        self.changed.notify_waiters();
    }

    /// After a drive of the job entered as `run_id`: true when it was asked again meanwhile
    /// and `stop` is not cancelled (it stays entered, to be driven once more); else it
    /// leaves, and whoever waits for the drives to stop is told.
    pub(crate) fn drive_again(&self, run_id: &str, stop: &CancelToken) -> bool {
        {
            let mut active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match active.get_mut(run_id) {
                Some(again) if *again && !stop.is_cancelled() => {
                    *again = false;
                    return true;
                }
                _ => {
                    active.remove(run_id);
                }
            }
        }
        self.changed.notify_waiters();
        false
    }

    /// Marks an approval deadline (run, request) as waited for; false when it already is.
    pub(crate) fn start_timer(&self, key: (String, String)) -> bool {
        self.timers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key)
    }

    /// Forgets an approval deadline that passed.
    pub(crate) fn end_timer(&self, key: &(String, String)) {
        self.timers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(key);
    }

    /// Waits until every drive has stopped (the stop token cut them), at most [`DRAIN_FOR`].
    pub(crate) async fn drain(&self) {
        let left = self.idle_by(tokio::time::Instant::now() + DRAIN_FOR).await;
        if left > 0 {
            eprintln!(
                "{}: {left} drive(s) did not stop within {} s; their runs are taken up by the next start",
                self.name,
                DRAIN_FOR.as_secs()
            );
        }
    }

    /// Waits until no drive is left and every slot is free again — each claimed run's
    /// task has given its lease back —, or `deadline`.
    pub(crate) async fn settled_by(&self, deadline: tokio::time::Instant) {
        if self.idle_by(deadline).await > 0 {
            return;
        }
        let all = tokio::time::timeout_at(deadline, self.slots.acquire_many(self.size)).await;
        drop(all);
    }

    /// Waits until no drive is left, or `deadline`; how many are left.
    pub(crate) async fn idle_by(&self, deadline: tokio::time::Instant) -> usize {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let left = self.active();
            if left == 0 || tokio::time::timeout_at(deadline, changed).await.is_err() {
                return left;
            }
        }
    }
}
