//! Where a job waits for a driver and which drivers may take it: its queue, its priority
//! (as the moment it is due), and the data dir that holds its workspace — and what a
//! worker asks for when it claims ([`Claimable`]).

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The queue every job waits in unless started in another.
pub const DEFAULT_QUEUE: &str = "default";

/// The highest priority a job may have (the lowest is 0, the default).
pub const PRIORITY_MAX: i16 = 9;

/// The aging time of a queue made without one (and of `default` until it is set): a run
/// waits at most ten minutes behind runs of higher priority queued after it.
pub const AGING_S_DEFAULT: u64 = 600;

/// When a run created at `at` with `priority` in a queue whose aging time is `aging_s` is
/// due: each point of priority moves it a ninth of the aging time earlier. None for
/// priority 0 (it is due when it was created).
pub fn due(at: DateTime<Utc>, priority: i16, aging_s: u64) -> Option<DateTime<Utc>> {
    if priority <= 0 {
        return None;
    }
    let aging_us = i64::try_from(aging_s).unwrap_or(i64::MAX).saturating_mul(1_000_000);
    let early_us = aging_us.saturating_mul(i64::from(priority)) / i64::from(PRIORITY_MAX);
    Some(at - chrono::Duration::microseconds(early_us))
}

/// A run's place among the runs waiting for drivers. A job's root carries it; the runs it
/// starts wait where their root does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The queue it waits in ([`DEFAULT_QUEUE`] unless started with `--queue`).
    #[serde(skip_serializing_if = "is_default_queue")]
    pub queue: String,
    /// 0 to [`PRIORITY_MAX`]; a higher one is due earlier.
    #[serde(skip_serializing_if = "is_zero")]
    pub priority: i16,
    /// When it is due among the runs waiting: its creation moved earlier by its priority
    /// ([`due`], so that a run waits at most its queue's aging time behind runs of higher
    /// priority queued after it). None: its creation. The store works it out when it
    /// creates the run, from the queue it names (what a creator gives is not read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at: Option<DateTime<Utc>>,
    /// The data dir that holds its workspace, as that data dir names itself, for a run
    /// with one: only a process on that data dir may drive its job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
}

impl Default for Placement {
    fn default() -> Self {
        Placement { queue: DEFAULT_QUEUE.to_owned(), priority: 0, due_at: None, home: None }
    }
}

impl Placement {
    /// Whether it says nothing a run created without one would not (the default queue,
    /// priority 0, no workspace).
    pub fn is_default(&self) -> bool {
        self == &Placement::default()
    }
}

fn is_default_queue(queue: &str) -> bool {
    queue == DEFAULT_QUEUE
}

fn is_zero(priority: &i16) -> bool {
    *priority == 0
}

/// What a worker claims: runs whose job waits in one of `queues` (every queue when it is
/// empty), whose workspace — if the job has one — is on its data dir (`home`), and whose
/// log holds no event newer than this build reads. Limits on queues and tenants are the
/// store's to apply, under the claim's lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claimable {
    pub queues: Vec<String>,
    /// This process's data dir, as it names itself (none: it has none, and claims only
    /// jobs without a workspace).
    pub home: Option<String>,
}

impl Claimable {
    /// Whether a job in `queue` whose runs' workspaces are on `homes` may be claimed.
    pub fn admits<'a>(&self, queue: &str, mut homes: impl Iterator<Item = &'a str>) -> bool {
        (self.queues.is_empty() || self.queues.iter().any(|q| q == queue))
            && homes.all(|h| self.home.as_deref() == Some(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_of_priority_is_a_ninth_of_the_aging_time() {
        let at = DateTime::from_timestamp(1_000_000, 0).unwrap_or_default();
        assert_eq!(due(at, 0, 900), None);
        assert_eq!(due(at, 1, 900), Some(at - chrono::Duration::seconds(100)));
        assert_eq!(due(at, PRIORITY_MAX, 900), Some(at - chrono::Duration::seconds(900)));
    }
}
