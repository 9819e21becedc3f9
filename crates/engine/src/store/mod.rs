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

pub mod conformance;
pub mod contract;
pub mod error;
pub mod memory;
pub mod placement;

pub use contract::*;
pub use error::Error;
pub use memory::MemoryStore;
pub use placement::{AGING_S_DEFAULT, Claimable, DEFAULT_QUEUE, PRIORITY_MAX, Placement};
