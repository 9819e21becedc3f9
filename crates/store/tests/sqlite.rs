//! The SQLite store passes the kernel's conformance suite, on a real file; its chain
//! detects damage made by hand, its migration chains old runs, and its backup is
//! consistent under load.

#![allow(clippy::unwrap_used)]

use baton_engine::chain;
use baton_engine::event::{Event, EventData, NewEvent, Warning};
use baton_engine::store::{EventStore, KeyClaim, RunRecord, conformance};
use baton_store::SqliteStore;

#[tokio::test]
async fn sqlite_store_conforms() {
    let dir = std::env::temp_dir().join(format!("baton-sqlite-{}", uuid::Uuid::now_v7()));
    let store = SqliteStore::open(dir.join("nested/baton.db")).unwrap();
    conformance::run_all(&store, "sql").await;
    baton_store::webhooks::conformance::run_all(&store, "sql").await;
    // Reopening the same file sees everything that was committed.
    drop(store);
    let again = SqliteStore::open(dir.join("nested/baton.db")).unwrap();
    conformance::reopened(&again, "sql").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A second connection to the store's file, editing it the way a person or a bad disk
/// would: past every check of the store. Events are edited inside their packed batches
/// (unpacked, changed, packed again with the batch's stored hash kept).
fn damage(db: &std::path::Path, run_id: &str, damage: conformance::Damage) {
    use conformance::Damage;
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let mut batches = baton_store::sqlite::raw_batches(&conn, run_id).unwrap();
    // The batch and the place in it of event `n`.
    let find = |batches: &[baton_store::sqlite::RawBatch], n: u64| {
        let n = i64::try_from(n).unwrap();
        let b = batches.iter().position(|b| b.first_seq <= n && n <= b.last_seq).unwrap();
        (b, usize::try_from(n - batches[b].first_seq).unwrap())
    };
    let set_last_seq = |n: u64| {
        conn.execute(
            "UPDATE runs SET last_seq = ?2 WHERE run_id = ?1",
            rusqlite::params![run_id, i64::try_from(n).unwrap()],
        )
        .unwrap();
    };
    match damage {
        Damage::Delete(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events.remove(i);
            batches[b].last_seq -= 1;
        }
        Damage::Swap(x, y) => {
            let ((bx, ix), (by, iy)) = (find(&batches, x), find(&batches, y));
            let ex = batches[bx].events[ix].clone();
            batches[bx].events[ix] = batches[by].events[iy].clone();
            batches[by].events[iy] = ex;
        }
        Damage::Payload(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events[i].payload["message"] = serde_json::json!("edited");
        }
        Damage::Renumber(n, m) => {
            let (b, _) = find(&batches, n);
            let shift = i64::try_from(m).unwrap() - batches[b].first_seq;
            batches[b].first_seq += shift;
            batches[b].last_seq += shift;
        }
        Damage::Time(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events[i].at_us += 1_000_000;
        }
        Damage::Kind(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events[i].kind = "heartbeat".to_owned();
        }
        Damage::Level(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events[i].level_id = Some("other".to_owned());
        }
        Damage::Attempt(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events[i].attempt = Some(9);
        }
        Damage::Version(n) => {
            let (b, i) = find(&batches, n);
            batches[b].events[i].version = 1;
        }
        Damage::Hash(n) => {
            let (b, _) = find(&batches, n);
            batches[b].hash = vec![0; 32];
        }
        Damage::LastSeq(n) => set_last_seq(n),
        Damage::Truncate(n) => {
            let (b, i) = find(&batches, n);
            batches.truncate(b + 1);
            batches[b].events.truncate(i + 1);
            batches[b].last_seq = i64::try_from(n).unwrap();
            set_last_seq(n);
        }
    }
    baton_store::sqlite::put_raw_batches(&conn, run_id, &batches).unwrap();
}

fn fresh_db(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("baton-sqlite-{name}-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("baton.db");
    (dir, db)
}

#[tokio::test]
async fn a_new_database_its_side_files_and_backups_are_its_users_alone_under_umask_022() {
    use std::os::unix::fs::PermissionsExt;
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let (dir, _) = fresh_db("private");
    let data = dir.join("data");
    let db = data.join("nested").join("baton.db");
    let store = SqliteStore::open(&db).unwrap();
    store.create_run(&record("r"), warnings(1, 2)).await.unwrap();
    let _held = store.hold("r").await.unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "a directory it creates");
    assert_eq!(mode(&data.join("nested")), 0o700, "a directory it creates");
    let copy = dir.join("copy.db");
    baton_store::backup(&db, &copy).unwrap();
    let mut files: Vec<std::path::PathBuf> =
        std::fs::read_dir(data.join("nested")).unwrap().map(|e| e.unwrap().path()).collect();
    files.push(copy);
    for side in ["baton.db", "baton.db-wal", "baton.db-shm", "baton.db.holds"] {
        assert!(files.iter().any(|f| f.ends_with(side)), "{side} in {files:?}");
    }
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn sqlite_store_detects_damage() {
    let (dir, db) = fresh_db("damage");
    let store = SqliteStore::open(&db).unwrap();
    conformance::damage_is_detected(&store, "sql", conformance::Links::Batches, &|id, d| {
        damage(&db, id, d);
        true
    })
    .await;
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
    RunRecord::new(id, "demo", "running", at)
}

#[tokio::test]
async fn a_column_that_cannot_be_read_is_named_with_its_run_and_event() {
    let (dir, db) = fresh_db("columns");
    let store = SqliteStore::open(&db).unwrap();
    store.create_run(&record("r1"), warnings(1, 3)).await.unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    store.append("r1", 4, warnings(4, 2), "running").await.unwrap();
    conn.execute("UPDATE batches SET at_us = 'two' WHERE first_seq = 4", []).unwrap();
    let err = store.load("r1", 0).await.unwrap_err().to_string();
    assert!(
        err.contains(
            "run r1 is damaged at event 4: its batch: column `at_us` holds text, where an integer belongs"
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

/// The schema files of the versions before the packed log, as an older build applied them.
const OLD_SCHEMA: [&str; 6] = [
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_leases.sql"),
    include_str!("../migrations/0003_chain.sql"),
    include_str!("../migrations/0004_scenario_texts.sql"),
    include_str!("../migrations/0005_run_trees.sql"),
    include_str!("../migrations/0006_tokens.sql"),
];

/// A database as a build of schema `version` (2 to 6) left it: its tables, and `runs` with
/// their events one row each (hashed from version 3 on, as that build did).
fn old_db(db: &std::path::Path, version: usize, runs: &[(&str, Vec<Event>)]) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)").unwrap();
    for (i, sql) in OLD_SCHEMA.iter().take(version).enumerate() {
        conn.execute_batch(sql).unwrap();
        conn.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [i64::try_from(i + 1).unwrap()],
        )
        .unwrap();
    }
    let hashed = version >= 3;
    for (id, events) in runs {
        let hashes = chain::hashes_in(chain::Form::CanonicalJson, chain::GENESIS, events);
        let head = hashes.last().copied().unwrap_or(chain::GENESIS);
        conn.execute(
            "INSERT INTO runs (run_id, scenario_id, status, created_at, updated_at, last_seq) VALUES (?1, 'demo', 'running', '2023-11-14T22:13:20.000000Z', '2023-11-14T22:13:20.000000Z', ?2)",
            rusqlite::params![id, i64::try_from(events.len()).unwrap()],
        )
        .unwrap();
        if hashed {
            conn.execute(
                "UPDATE runs SET head_hash = ?2 WHERE run_id = ?1",
                rusqlite::params![id, head.as_slice()],
            )
            .unwrap();
        }
        for (e, hash) in events.iter().zip(&hashes) {
            conn.execute(
                "INSERT INTO events (run_id, seq, at_us, kind, version, level_id, attempt, data) VALUES (?1, ?2, ?3, ?4, 2, ?5, ?6, ?7)",
                rusqlite::params![id, i64::try_from(e.seq).unwrap(), e.at.timestamp_micros(), e.data.kind(), e.level_id, e.attempt, e.data.payload().to_string()],
            )
            .unwrap();
            if hashed {
                conn.execute(
                    "UPDATE events SET hash = ?3 WHERE run_id = ?1 AND seq = ?2",
                    rusqlite::params![id, i64::try_from(e.seq).unwrap(), hash.as_slice()],
                )
                .unwrap();
            }
        }
    }
}

#[tokio::test]
async fn migration_0007_packs_the_per_event_rows_of_an_older_build() {
    let (dir, db) = fresh_db("migrate-packed");
    let long: Vec<Event> = warnings(1, 150);
    old_db(
        &db,
        6,
        &[
            ("old", warnings(1, 4)),
            ("empty", Vec::new()),
            ("long", long.clone()),
            ("bad", warnings(1, 6)),
        ],
    );
    // Damage made before the upgrade: event 4 of `bad` edited by hand.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("UPDATE events SET data = json_set(data, '$.message', 'edited') WHERE run_id = 'bad' AND seq = 4", []).unwrap();
    drop(conn);
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(store.load("old", 0).await.unwrap(), warnings(1, 4));
    assert_eq!(
        store.verify("old").await.unwrap().head,
        chain::hashes_in(chain::Form::CanonicalJson, chain::GENESIS, &warnings(1, 4))[3]
    );
    assert_eq!(store.verify("empty").await.unwrap().last_seq, 0);
    assert_eq!(store.load("long", 0).await.unwrap(), long);
    assert_eq!(store.load("long", 100).await.unwrap(), long[100..].to_vec());
    // The damage is still found, at the same event, and nothing is driven on it.
    match store.load("bad", 0).await {
        Err(baton_engine::store::Error::Damaged { run_id, seq, .. }) => {
            assert_eq!((run_id.as_str(), seq), ("bad", 4));
        }
        other => panic!("a run damaged before the upgrade must stay refused, got {other:?}"),
    }
    store.append("old", 5, warnings(5, 1), "running").await.unwrap();
    assert_eq!(store.load("old", 0).await.unwrap(), warnings(1, 5));
    drop(store);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let tables: i64 = conn
        .query_row("SELECT COUNT(*) FROM sqlite_master WHERE name = 'events'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 0, "the per-event rows are gone");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn migration_0005_opens_a_database_from_before_run_trees() {
    let (dir, db) = fresh_db("migrate-trees");
    old_db(&db, 4, &[("old", warnings(1, 2))]);
    let store = SqliteStore::open(&db).unwrap();
    let old = store.run("old").await.unwrap().unwrap();
    assert_eq!(
        (old.parent_run_id, old.root_run_id, old.idempotency, old.tenant),
        (None, None, None, None)
    );
    assert_eq!(store.load("old", 0).await.unwrap().len(), 2);
    let mut keyed = record("new");
    keyed.idempotency = Some(KeyClaim {
        key: "k".to_owned(),
        request: "r".to_owned(),
        expires_at: chrono::Utc::now() + chrono::Duration::days(1),
    });
    store.create_run(&keyed, warnings(1, 1)).await.unwrap();
    assert_eq!(store.run_by_key(None, "k").await.unwrap().unwrap().run_id, "new");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn migration_0008_keeps_old_keys_for_a_day_from_their_run_matching_any_request() {
    let (dir, db) = fresh_db("migrate-keys");
    old_db(&db, 6, &[("old", warnings(1, 1)), ("recent", warnings(1, 1))]);
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        conn.execute("UPDATE runs SET idempotency_key = 'old-key' WHERE run_id = 'old'", [])
            .unwrap();
        conn.execute(
            "UPDATE runs SET idempotency_key = 'recent-key', tenant = 'acme', created_at = ?1 WHERE run_id = 'recent'",
            [now],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(store.run_by_key(None, "old-key").await.unwrap(), None, "a day has passed");
    let recent = store.run_by_key(Some("acme"), "recent-key").await.unwrap().unwrap();
    assert_eq!(recent.run_id, "recent");
    let claim = recent.idempotency.unwrap();
    assert!(claim.matches("any request"), "an old key matches any request");
    assert_eq!(store.run_by_key(None, "recent-key").await.unwrap(), None, "per tenant");
    let mut again = record("again");
    again.idempotency = Some(KeyClaim {
        key: "old-key".to_owned(),
        request: "r".to_owned(),
        expires_at: chrono::Utc::now() + chrono::Duration::days(1),
    });
    store.create_run(&again, warnings(1, 1)).await.unwrap();
    assert_eq!(store.run_by_key(None, "old-key").await.unwrap().unwrap().run_id, "again");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn migration_0003_chains_the_runs_already_stored() {
    let (dir, db) = fresh_db("migrate");
    // Schema 2: no hashes.
    old_db(&db, 2, &[("old", warnings(1, 4)), ("empty", Vec::new())]);
    let store = SqliteStore::open(&db).unwrap();
    let after = store.verify("old").await.unwrap();
    assert_eq!(
        after.head,
        chain::hashes_in(chain::Form::CanonicalJson, chain::GENESIS, &warnings(1, 4))[3]
    );
    // A run stored before the encoded form keeps the form it was hashed in, appends too.
    assert_eq!(after.form, chain::Form::CanonicalJson);
    assert_eq!(store.verify("empty").await.unwrap().last_seq, 0);
    store.append("old", 5, warnings(5, 1), "running").await.unwrap();
    assert_eq!(store.load("old", 0).await.unwrap().len(), 5);
    let appended = store.verify("old").await.unwrap();
    assert_eq!(appended.form, chain::Form::CanonicalJson);
    assert_eq!(
        appended.head,
        chain::hashes_in(chain::Form::CanonicalJson, chain::GENESIS, &warnings(1, 5))[4]
    );
    // A run created today takes the encoded form.
    store.create_run(&record("new"), warnings(1, 2)).await.unwrap();
    let new = store.verify("new").await.unwrap();
    assert_eq!(
        (new.form, new.head),
        (chain::Form::Encoded, chain::hashes(chain::GENESIS, &warnings(1, 2))[1])
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn migration_0004_keeps_scenario_texts_in_a_database_from_before() {
    let (dir, db) = fresh_db("migrate-texts");
    // Schema 3: no scenario texts.
    old_db(&db, 3, &[("old", warnings(1, 2))]);
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

/// A database a newer binary moved past this binary's schema version is refused, naming
/// both versions, and left as it was (never written by a binary that does not know it).
#[tokio::test]
async fn a_database_at_a_newer_version_is_refused_naming_both() {
    let (dir, db) = fresh_db("newer");
    let store = SqliteStore::open(&db).unwrap();
    drop(store);
    let ours = baton_store::schema::version(baton_store::schema::Backend::Sqlite);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("INSERT INTO schema_version (version) VALUES (?1)", [ours + 1]).unwrap();
    drop(conn);
    let refused = SqliteStore::open(&db).unwrap_err().to_string();
    let expected = format!("schema version {}, newer than this binary's {ours}", ours + 1);
    assert!(refused.contains(&expected), "{refused}");
    assert!(refused.contains(&db.display().to_string()), "{refused}");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let versions: i64 =
        conn.query_row("SELECT COUNT(*) FROM schema_version", [], |r| r.get(0)).unwrap();
    assert_eq!(versions, ours + 1);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Queues on SQLite: made once (a second create of a name says it exists), changed only
/// when they exist, listed with `default`; a tenant's limit set, listed and removed.
#[tokio::test]
async fn queues_are_made_once_changed_when_they_exist_and_listed() {
    use baton_store::queues::{QueueChange, QueueRecord, QueueSet, QueueStore};
    let (dir, db) = fresh_db("queues");
    let store = SqliteStore::open(&db).unwrap();
    let at = chrono::Utc::now();
    let gpu = QueueRecord {
        name: "gpu".to_owned(),
        aging_s: 90,
        max_running: Some(2),
        created_at: at,
        updated_at: at,
    };
    assert_eq!(store.create_queue(&gpu).await.unwrap(), QueueChange::Created);
    assert_eq!(store.create_queue(&gpu).await.unwrap(), QueueChange::Exists);
    let unlimited = QueueSet { aging_s: None, max_running: Some(None) };
    assert_eq!(store.change_queue("cpu", unlimited, at).await.unwrap(), None);
    // Two changes of different settings both hold: each sets only its own.
    let slower = QueueSet { aging_s: Some(300), max_running: None };
    let changed = store.change_queue("gpu", slower, at).await.unwrap().unwrap();
    assert_eq!((changed.aging_s, changed.max_running), (300, Some(2)));
    let changed = store.change_queue("gpu", unlimited, at).await.unwrap().unwrap();
    assert_eq!((changed.aging_s, changed.max_running), (300, None));
    let loads = store.queue_loads(at).await.unwrap();
    let names: Vec<&str> = loads.iter().map(|l| l.queue.name.as_str()).collect();
    assert_eq!(names, ["default", "gpu"]);
    assert_eq!(store.queue("gpu").await.unwrap().unwrap().max_running, None);
    assert!(store.set_tenant_limit("acme", Some(3), at).await.unwrap());
    assert_eq!(store.tenant_limits().await.unwrap()[0].max_running, 3);
    assert!(store.set_tenant_limit("acme", None, at).await.unwrap());
    assert!(!store.set_tenant_limit("acme", None, at).await.unwrap());
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
