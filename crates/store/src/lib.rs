//! Stores for the Baton kernel: an embedded SQLite store (the default) and a PostgreSQL
//! store for many worker processes.
//!
//! Each store implements `baton_engine::store::EventStore` and passes its conformance
//! suite. The kernel never names a concrete store; the CLI wires one in.

mod barrier;
pub mod packed;
pub mod postgres;
pub mod queues;
pub mod run_holds;
pub mod schema;
pub mod sqlite;
mod sqlite_log;
mod sqlite_queues;
mod sqlite_rows;
mod sqlite_webhooks;
mod stored;
pub mod tokens;
pub mod webhooks;

pub use postgres::PostgresStore;
pub use queues::QueueStore;
pub use sqlite::{SqliteStore, backup};
pub use tokens::{Role, SessionRecord, TokenRecord, TokenStore};
pub use webhooks::WebhookStore;

/// A store of runs, of the server's tokens, of webhooks and of queues: what a process
/// opens.
pub trait Store: baton_engine::store::EventStore + TokenStore + WebhookStore + QueueStore {}

impl<T: baton_engine::store::EventStore + TokenStore + WebhookStore + QueueStore> Store for T {}
