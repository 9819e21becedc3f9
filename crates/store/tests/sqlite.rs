//! The SQLite store passes the kernel's conformance suite, on a real file.

#![allow(clippy::unwrap_used)]

use baton_engine::store::conformance;
use baton_store::SqliteStore;

#[tokio::test]
async fn sqlite_store_conforms() {
    let dir = std::env::temp_dir().join(format!("baton-sqlite-{}", uuid::Uuid::now_v7()));
    let store = SqliteStore::open(dir.join("nested/baton.db")).unwrap();
    conformance::run_all(&store, "sql").await;
    // Reopening the same file sees everything that was committed.
    drop(store);
    let again = SqliteStore::open(dir.join("nested/baton.db")).unwrap();
    conformance::reopened(&again, "sql").await;
    let _ = std::fs::remove_dir_all(dir);
}
