//! Queues and limits: the queues a job may be started in, each with its aging time and an
//! optional limit on the runs its workers drive at once, and that limit per tenant.
//!
//! They live in the database, beside the runs, so that every process of a fleet sees the
//! same ones: a start names a queue that exists (the labels a metric is split by stay a
//! closed set), and a claim counts the runs leased in its job's queue and tenant under the
//! claim's lock (see each store's claim). `default` always exists.

use baton_engine::model::BoxFuture;
use baton_engine::store::{DEFAULT_QUEUE, Error};

pub use baton_engine::store::AGING_S_DEFAULT;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// The longest a queue name may be.
pub const NAME_CHARS_MAX: usize = 40;

/// At most this many queues exist at once (each is a label value of the queue metrics).
pub const QUEUES_MAX: usize = 100;

/// The longest aging time a queue may have (a week).
pub const AGING_S_MAX: u64 = 7 * 24 * 3600;

/// A queue as it is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueRecord {
    pub name: String,
    /// How long a run waits at most behind runs of higher priority queued after it: each
    /// point of priority moves a run's due time a ninth of it earlier.
    pub aging_s: u64,
    /// The most runs of the queue leased at once across the fleet (none: no limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A queue with the runs in it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueLoad {
    #[serde(flatten)]
    pub queue: QueueRecord,
    /// Runs of the queue's jobs that wait for a driver: running, not leased, and not held
    /// by a process driving them.
    pub waiting: u64,
    /// Runs of the queue's jobs leased by a worker now.
    pub leased: u64,
}

/// A tenant's limit on the runs leased at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TenantLimit {
    pub tenant: String,
    pub max_running: u32,
    pub updated_at: DateTime<Utc>,
}

/// What creating a queue did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueChange {
    Created,
    /// A queue of that name exists.
    Exists,
    /// There are [`QUEUES_MAX`] queues already.
    Full,
}

/// What a change sets of a queue: each field given is set, the others stay as they are
/// (in the same statement, so two changes of different fields both hold).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueSet {
    pub aging_s: Option<u64>,
    /// `Some(None)` removes the limit.
    pub max_running: Option<Option<u32>>,
}

/// Where queues and tenant limits are kept (both stores, beside the runs).
pub trait QueueStore: Send + Sync {
    /// Creates `queue`, unless one of its name exists or there are too many.
    fn create_queue<'a>(
        &'a self,
        queue: &'a QueueRecord,
    ) -> BoxFuture<'a, Result<QueueChange, Error>>;
    /// Sets what `set` gives of queue `name` in one statement; the queue as it is then, or
    /// none when there is no such queue.
    fn change_queue<'a>(
        &'a self,
        name: &'a str,
        set: QueueSet,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<QueueRecord>, Error>>;
    /// The queue with this name.
    fn queue<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<QueueRecord>, Error>>;
    /// Every queue, by name, with the runs waiting in it and leased from it at `now`.
    fn queue_loads(&self, now: DateTime<Utc>) -> BoxFuture<'_, Result<Vec<QueueLoad>, Error>>;
    /// Sets (`Some`) or removes (`None`) a tenant's limit; false when there was none to
    /// remove.
    fn set_tenant_limit<'a>(
        &'a self,
        tenant: &'a str,
        max_running: Option<u32>,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// Every tenant's limit, by tenant.
    fn tenant_limits(&self) -> BoxFuture<'_, Result<Vec<TenantLimit>, Error>>;
}

/// Why `name` cannot name a queue, if it cannot: 1 to [`NAME_CHARS_MAX`] lowercase
/// letters, digits, `-` and `_`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), String> {
    let fits = !name.is_empty()
        && name.len() <= NAME_CHARS_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric());
    if fits {
        Ok(())
    } else {
        Err(format!(
            "a queue name is 1 to {NAME_CHARS_MAX} lowercase letters, digits, `-` and `_`, starting with a letter or digit, not {:?}",
            name.chars().take(NAME_CHARS_MAX + 8).collect::<String>()
        ))
    }
}

/// Whether `name` is the queue every job waits in unless told otherwise.
pub fn is_default(name: &str) -> bool {
    name == DEFAULT_QUEUE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_a_closed_alphabet() {
        for good in ["default", "gpu", "batch-2", "a_b", "9"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "GPU", "-x", "a b", "a,b", "é", &"x".repeat(41)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
