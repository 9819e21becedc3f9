//! Stores for the Baton kernel: an embedded SQLite store (the default).
//!
//! Each store implements `baton_engine::store::EventStore` and passes its conformance
//! suite. The kernel never names a concrete store; the CLI wires one in.

pub mod sqlite;
pub mod tokens;

pub use sqlite::{SqliteStore, backup};
pub use tokens::{Role, TokenRecord, TokenStore};
