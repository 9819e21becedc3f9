//! How a store refuses: the one error every event store returns.

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
    /// A run was created in a queue that does not exist.
    #[error(
        "there is no queue {0:?}; make it with `baton queue create {0}` (`baton queue list` shows the queues)"
    )]
    NoQueue(String),
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
