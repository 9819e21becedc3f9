//! The SQLite store passes the kernel's conformance suite, on a real file; its chain
//! detects damage made by hand, its migration chains old runs, and its backup is
//! consistent under load.

#![allow(clippy::unwrap_used)]

use baton_engine::chain;
use baton_engine::event::{Event, EventData, NewEvent, Warning};
use baton_engine::store::{EventStore, RunRecord, conformance};
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

/// A second connection to the store's file, editing it the way a person or a bad disk
/// would: past every check of the store.
fn damage(db: &std::path::Path, run_id: &str, damage: conformance::Damage) {
    use conformance::Damage;
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let seq = |n: u64| i64::try_from(n).unwrap();
    let on = |sql: &str, n: u64| {
        let changed = conn.execute(sql, rusqlite::params![run_id, seq(n)]).unwrap();
        assert!(changed >= 1, "{damage:?}: `{sql}` changed nothing");
    };
    match damage {
        Damage::Delete(n) => on("DELETE FROM events WHERE run_id = ?1 AND seq = ?2", n),
        Damage::Swap(a, b) => {
            on("UPDATE events SET seq = -1 WHERE run_id = ?1 AND seq = ?2", a);
            conn.execute(
                "UPDATE events SET seq = ?2 WHERE run_id = ?1 AND seq = ?3",
                rusqlite::params![run_id, seq(a), seq(b)],
            )
            .unwrap();
            on("UPDATE events SET seq = ?2 WHERE run_id = ?1 AND seq = -1", b);
        }
        Damage::Payload(n) => on(
            "UPDATE events SET data = json_set(data, '$.message', 'edited') WHERE run_id = ?1 AND seq = ?2",
            n,
        ),
        Damage::Renumber(n, m) => {
            conn.execute(
                "UPDATE events SET seq = ?3 WHERE run_id = ?1 AND seq = ?2",
                rusqlite::params![run_id, seq(n), seq(m)],
            )
            .unwrap();
        }
        Damage::Time(n) => {
            on("UPDATE events SET at_us = at_us + 1000000 WHERE run_id = ?1 AND seq = ?2", n);
        }
        Damage::Kind(n) => {
            on("UPDATE events SET kind = 'heartbeat' WHERE run_id = ?1 AND seq = ?2", n);
        }
        Damage::Level(n) => {
            on("UPDATE events SET level_id = 'other' WHERE run_id = ?1 AND seq = ?2", n);
        }
        Damage::Attempt(n) => on("UPDATE events SET attempt = 9 WHERE run_id = ?1 AND seq = ?2", n),
        Damage::Hash(n) => {
            on("UPDATE events SET hash = zeroblob(32) WHERE run_id = ?1 AND seq = ?2", n);
        }
        Damage::LastSeq(n) => on("UPDATE runs SET last_seq = ?2 WHERE run_id = ?1", n),
        Damage::Truncate(n) => {
            on("DELETE FROM events WHERE run_id = ?1 AND seq > ?2", n);
            on("UPDATE runs SET last_seq = ?2 WHERE run_id = ?1", n);
        }
    }
}

fn fresh_db(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("baton-sqlite-{name}-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("baton.db");
    (dir, db)
}

#[tokio::test]
async fn sqlite_store_detects_damage() {
    let (dir, db) = fresh_db("damage");
    let store = SqliteStore::open(&db).unwrap();
    conformance::damage_is_detected(&store, "sql", &|id, d| damage(&db, id, d)).await;
    let _ = std::fs::remove_dir_all(dir);
}

fn warnings(from: u64, n: u64) -> Vec<Event> {
    let at = chrono::DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
    (from..from + n)
        .map(|seq| {
            NewEvent::level(
                "l1",
                1,
                EventData::Warning(Warning {
                    message: format!("event {seq}: {}", "x".repeat(200)),
                }),
            )
            .at(seq, at)
        })
        .collect()
}

fn record(id: &str) -> RunRecord {
    let at = chrono::DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap();
    RunRecord {
        run_id: id.to_owned(),
        scenario_id: "demo".to_owned(),
        status: "running".to_owned(),
        created_at: at,
        updated_at: at,
        last_seq: 0,
        parent_run_id: None,
        root_run_id: None,
        idempotency_key: None,
        tenant: None,
    }
}

#[tokio::test]
async fn a_column_that_cannot_be_read_is_named_with_its_run_and_event() {
    let (dir, db) = fresh_db("columns");
    let store = SqliteStore::open(&db).unwrap();
    store.create_run(&record("r1"), warnings(1, 3)).await.unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("UPDATE events SET attempt = 'two' WHERE run_id = 'r1' AND seq = 2", []).unwrap();
    let err = store.load("r1", 0).await.unwrap_err().to_string();
    assert!(
        err.contains(
            "run r1 is damaged at event 2: column `attempt` holds text, where an integer or null belongs"
        ),
        "{err}"
    );
    conn.execute("UPDATE runs SET last_seq = 'three' WHERE run_id = 'r1'", []).unwrap();
    let err = store.run("r1").await.unwrap_err().to_string();
    assert!(
        err.contains("run r1 is damaged") && err.contains("column `last_seq` holds text"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Undoes migration 0005 (run trees, tenants, idempotency keys) in a database, as if it
/// were written before it.
/// Back to schema 5: no tokens, no tenant index.
const UNDO_0006: &str = "DROP INDEX runs_by_tenant; DROP TABLE tokens;
    DELETE FROM schema_version WHERE version >= 6;";

const UNDO_0005: &str = "DROP INDEX runs_by_root; DROP INDEX runs_by_idempotency_key;
    ALTER TABLE runs DROP COLUMN parent_run_id; ALTER TABLE runs DROP COLUMN root_run_id;
    ALTER TABLE runs DROP COLUMN idempotency_key; ALTER TABLE runs DROP COLUMN tenant;
    DROP TABLE tenant_overrides; DELETE FROM schema_version WHERE version >= 5;";

#[tokio::test]
async fn migration_0005_opens_a_database_from_before_run_trees() {
    let (dir, db) = fresh_db("migrate-trees");
    let store = SqliteStore::open(&db).unwrap();
    store.create_run(&record("old"), warnings(1, 2)).await.unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(UNDO_0006).unwrap();
    conn.execute_batch(UNDO_0005).unwrap();
    drop(conn);
    let store = SqliteStore::open(&db).unwrap();
    let old = store.run("old").await.unwrap().unwrap();
    assert_eq!(
        (old.parent_run_id, old.root_run_id, old.idempotency_key, old.tenant),
        (None, None, None, None)
    );
    assert_eq!(store.load("old", 0).await.unwrap().len(), 2);
    let mut keyed = record("new");
    keyed.idempotency_key = Some("k".to_owned());
    store.create_run(&keyed, warnings(1, 1)).await.unwrap();
    assert_eq!(store.run_by_key("k").await.unwrap().unwrap().run_id, "new");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn migration_0003_chains_the_runs_already_stored() {
    let (dir, db) = fresh_db("migrate");
    let store = SqliteStore::open(&db).unwrap();
    store.create_run(&record("old"), warnings(1, 4)).await.unwrap();
    store.create_run(&record("empty"), Vec::new()).await.unwrap();
    let before = store.verify("old").await.unwrap();
    drop(store);
    // Back to schema 2: no hashes (and none of the later tables).
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(UNDO_0006).unwrap();
    conn.execute_batch(UNDO_0005).unwrap();
    conn.execute_batch(
        "ALTER TABLE events DROP COLUMN hash; ALTER TABLE runs DROP COLUMN head_hash;
         DROP TABLE scenario_texts; DELETE FROM schema_version WHERE version >= 3;",
    )
    .unwrap();
    drop(conn);
    let store = SqliteStore::open(&db).unwrap();
    let after = store.verify("old").await.unwrap();
    assert_eq!(after, before, "the back-filled chain is the one the store writes");
    assert_eq!(after.head, chain::hashes(chain::GENESIS, &warnings(1, 4))[3]);
    assert_eq!(store.verify("empty").await.unwrap().last_seq, 0);
    store.append("old", 5, warnings(5, 1), "running").await.unwrap();
    assert_eq!(store.load("old", 0).await.unwrap().len(), 5);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn migration_0004_keeps_scenario_texts_in_a_database_from_before() {
    let (dir, db) = fresh_db("migrate-texts");
    let store = SqliteStore::open(&db).unwrap();
    store.create_run(&record("old"), warnings(1, 2)).await.unwrap();
    drop(store);
    // Back to schema 3: no scenario texts.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(UNDO_0006).unwrap();
    conn.execute_batch(UNDO_0005).unwrap();
    conn.execute_batch("DROP TABLE scenario_texts; DELETE FROM schema_version WHERE version = 4;")
        .unwrap();
    drop(conn);
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(store.load("old", 0).await.unwrap().len(), 2);
    assert_eq!(store.scenario_texts("abc").await.unwrap(), None);
    assert!(store.put_scenario_texts("abc", "qa", "{}").await.unwrap());
    assert!(!store.put_scenario_texts("abc", "qa", "{\"x\":1}").await.unwrap());
    drop(store);
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(store.scenario_texts("abc").await.unwrap().as_deref(), Some("{}"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_backup_taken_while_runs_are_appended_verifies() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (dir, db) = fresh_db("backup");
    let store = SqliteStore::open(&db).unwrap();
    // Enough data that copying it takes a while.
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..1500 {
            let store = store.clone();
            tasks.spawn(async move {
                store.create_run(&record(&format!("base-{i}")), warnings(1, 10)).await.unwrap();
            });
        }
        while tasks.join_next().await.is_some() {}
    });
    // The writer: new runs, appended to event by event, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicU64::new(0));
    let writer = {
        let (store, stop, appended) = (store.clone(), Arc::clone(&stop), Arc::clone(&appended));
        rt.spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("live-{n}");
                store.create_run(&record(&id), warnings(1, 1)).await.unwrap();
                for seq in 2..=4 {
                    store.append(&id, seq, warnings(seq, 1), "running").await.unwrap();
                    appended.fetch_add(1, Ordering::SeqCst);
                }
                n += 1;
            }
        })
    };
    while appended.load(Ordering::SeqCst) < 10 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut overlapped = 0;
    let mut copies = Vec::new();
    for i in 0..5 {
        let dest = dir.join(format!("copy-{i}.db"));
        let before = appended.load(Ordering::SeqCst);
        baton_store::backup(&db, &dest).unwrap();
        if appended.load(Ordering::SeqCst) > before {
            overlapped += 1;
        }
        copies.push(dest);
    }
    stop.store(true, Ordering::SeqCst);
    rt.block_on(writer).unwrap();
    assert!(overlapped > 0, "the writer committed while a copy was being made");

    // A backup never overwrites.
    let err = baton_store::backup(&db, &copies[0]).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");

    rt.block_on(async {
        for dest in &copies {
            let copy = SqliteStore::open(dest).unwrap();
            let runs = copy.runs(None).await.unwrap();
            assert!(runs.len() > 1500, "{} has every run committed before it", dest.display());
            for run in &runs {
                let verified = copy.verify(&run.run_id).await.unwrap();
                assert_eq!(verified.last_seq, run.last_seq);
            }
        }
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// A reader in another connection (another process, as far as SQLite knows) loads a run
/// while it is appended to: the run's record and its events are read in one snapshot, so
/// a commit landing between the two never looks like a damaged log.
#[test]
fn a_run_loaded_while_another_connection_appends_to_it_is_never_taken_for_damaged() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (dir, db) = fresh_db("load-race");
    let writer_store = SqliteStore::open(&db).unwrap();
    let reader_store = SqliteStore::open(&db).unwrap();
    rt.block_on(writer_store.create_run(&record("raced"), warnings(1, 1))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, stop) = (writer_store.clone(), Arc::clone(&stop));
        rt.spawn(async move {
            let mut seq = 2;
            while !stop.load(Ordering::SeqCst) && seq < 3_000 {
                store.append("raced", seq, warnings(seq, 1), "running").await.unwrap();
                seq += 1;
            }
            seq - 1
        })
    };
    let (mut loads, mut grew) = (0, 0);
    let mut last = 0;
    rt.block_on(async {
        while !writer.is_finished() && loads < 4_000 {
            let events = reader_store.load("raced", 0).await.unwrap_or_else(|e| {
                panic!("load {loads} saw a damaged log while another connection appended: {e}")
            });
            // From where the last load ended, and the whole chain, the same way.
            let tail = reader_store.load("raced", last).await.unwrap();
            assert!(tail.first().is_none_or(|e| e.seq == last + 1));
            let verified = reader_store.verify("raced").await.unwrap();
            assert!(verified.last_seq >= events.len() as u64);
            if events.len() as u64 > last {
                grew += 1;
            }
            last = events.len() as u64;
            loads += 1;
        }
    });
    stop.store(true, Ordering::SeqCst);
    let written = rt.block_on(writer).unwrap();
    assert!(grew > 10, "the reader saw the log grow while it read ({grew} of {loads} loads)");
    let all = rt.block_on(reader_store.load("raced", 0)).unwrap();
    assert_eq!(all.len() as u64, written);
    let _ = std::fs::remove_dir_all(dir);
}

/// Probes of whether a run is held (`is_held`: every run listing and status page asks)
/// never make its driver's lock fail: a driver that starts while a probe looks gets the run.
#[test]
fn a_driver_taking_a_run_while_others_probe_it_is_never_refused_as_busy() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (dir, db) = fresh_db("probe-race");
    let store = SqliteStore::open(&db).unwrap();
    rt.block_on(store.create_run(&record("probed"), warnings(1, 1))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let probes = Arc::new(AtomicU64::new(0));
    let prober = {
        let (store, stop, probes) = (store.clone(), Arc::clone(&stop), Arc::clone(&probes));
        rt.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let _ = store.is_held("probed").await.unwrap();
                probes.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    let mut busy = 0;
    rt.block_on(async {
        for _ in 0..2_000 {
            match store.hold("probed").await {
                Ok(guard) => drop(guard),
                Err(baton_engine::store::Error::Busy(_)) => busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
    });
    stop.store(true, Ordering::SeqCst);
    rt.block_on(prober).unwrap();
    assert!(probes.load(Ordering::SeqCst) > 100, "the prober ran alongside");
    assert_eq!(busy, 0, "{busy} of 2000 holds were refused while only probes looked");
    // A driver that really holds it is still Busy to the next.
    rt.block_on(async {
        let held = store.hold("probed").await.unwrap();
        assert!(matches!(store.hold("probed").await, Err(baton_engine::store::Error::Busy(_))));
        assert!(store.is_held("probed").await.unwrap());
        drop(held);
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn processes_opening_a_new_database_at_once_migrate_it_once() {
    for round in 0..5 {
        let (dir, db) = fresh_db(&format!("migrate-race-{round}"));
        let openers: Vec<_> = (0..4)
            .map(|_| {
                let db = db.clone();
                std::thread::spawn(move || SqliteStore::open(&db).map(|_| ()))
            })
            .collect();
        for opener in openers {
            opener.join().unwrap().unwrap();
        }
        let conn = rusqlite::Connection::open(&db).unwrap();
        let versions: i64 =
            conn.query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0)).unwrap();
        let distinct: i64 = conn
            .query_row("SELECT COUNT(DISTINCT version) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(versions, distinct, "each migration recorded once");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Tokens are kept by hash, found by it, listed per tenant, revoked once, and kept across
/// a reopen; a second token with the same id is refused.
#[tokio::test]
async fn tokens_are_kept_by_hash_and_revoked_once() {
    use baton_store::TokenStore;
    let (dir, db) = fresh_db("tokens");
    baton_store::tokens::conformance::run_all(&SqliteStore::open(&db).unwrap()).await;
    let store = SqliteStore::open_existing(&db).unwrap();
    let revoked = store.token_by_hash("aa").await.unwrap().expect("kept");
    assert!(revoked.revoked_at.is_some());
    let _ = std::fs::remove_dir_all(dir);
}
