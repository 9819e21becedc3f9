//! The PostgreSQL store passes the kernel's conformance suite on the real server this
//! machine runs (each test in a schema of its own, dropped after): damage is detected,
//! runs are held by one process at a time and let go when it dies, appends from another
//! process wake waiters, two processes racing to append make one winner, and a process's
//! appends are written in groups that refuse a run that misses alone.
//!
//! The server is `BATON_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`).

#![allow(clippy::unwrap_used)]

use baton_engine::event::{Event, EventData, NewEvent, Warning};
use baton_engine::store::{Error, EventStore, KeyClaim, RunRecord, conformance};
use baton_store::postgres::{PostgresStore, ScratchSchema};

fn base() -> String {
    std::env::var("BATON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

async fn scratch(label: &str) -> ScratchSchema {
    ScratchSchema::create(&base(), label).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms() {
    let schema = scratch("conforms").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    conformance::run_all(&store, "pg").await;
    drop(store);
    let again = PostgresStore::connect(&schema.url).await.unwrap();
    conformance::reopened(&again, "pg").await;
    baton_store::tokens::conformance::run_all(&again).await;
    baton_store::webhooks::conformance::run_all(&again, "pg").await;
}

/// A second connection editing the tables the way a person or a bad disk would.
async fn damage(client: &tokio_postgres::Client, run_id: &str, damage: conformance::Damage) {
    use conformance::Damage;
    let seq = |n: u64| i64::try_from(n).unwrap();
    let on = |sql: &'static str, n: u64| async move {
        let changed = client.execute(sql, &[&run_id, &seq(n)]).await.unwrap();
        assert!(changed >= 1, "{damage:?}: `{sql}` changed nothing");
    };
    match damage {
        Damage::Delete(n) => on("DELETE FROM events WHERE run_id = $1 AND seq = $2", n).await,
        Damage::Swap(a, b) => {
            on("UPDATE events SET seq = -1 WHERE run_id = $1 AND seq = $2", a).await;
            client
                .execute(
                    "UPDATE events SET seq = $2 WHERE run_id = $1 AND seq = $3",
                    &[&run_id, &seq(a), &seq(b)],
                )
                .await
                .unwrap();
            on("UPDATE events SET seq = $2 WHERE run_id = $1 AND seq = -1", b).await;
        }
        Damage::Payload(n) => {
            on(
                "UPDATE events SET data = jsonb_set(data::jsonb, '{message}', '\"edited\"')::text WHERE run_id = $1 AND seq = $2",
                n,
            )
            .await;
        }
        Damage::Renumber(n, m) => {
            client
                .execute(
                    "UPDATE events SET seq = $3 WHERE run_id = $1 AND seq = $2",
                    &[&run_id, &seq(n), &seq(m)],
                )
                .await
                .unwrap();
        }
        Damage::Time(n) => {
            on("UPDATE events SET at_us = at_us + 1000000 WHERE run_id = $1 AND seq = $2", n).await;
        }
        Damage::Kind(n) => {
            on("UPDATE events SET kind = 'heartbeat' WHERE run_id = $1 AND seq = $2", n).await;
        }
        Damage::Level(n) => {
            on("UPDATE events SET level_id = 'other' WHERE run_id = $1 AND seq = $2", n).await;
        }
        Damage::Attempt(n) => {
            on("UPDATE events SET attempt = 9 WHERE run_id = $1 AND seq = $2", n).await;
        }
        Damage::Version(n) => {
            on("UPDATE events SET version = 1 WHERE run_id = $1 AND seq = $2", n).await;
        }
        Damage::Hash(n) => {
            on(
                "UPDATE events SET hash = decode(repeat('00', 32), 'hex') WHERE run_id = $1 AND seq = $2",
                n,
            )
            .await;
        }
        Damage::LastSeq(n) => on("UPDATE runs SET last_seq = $2 WHERE run_id = $1", n).await,
        Damage::Truncate(n) => {
            on("DELETE FROM events WHERE run_id = $1 AND seq > $2", n).await;
            on("UPDATE runs SET last_seq = $2 WHERE run_id = $1", n).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_detects_damage() {
    let schema = scratch("damage").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let handle = tokio::runtime::Handle::current();
    let edit = |id: &str, d: conformance::Damage| {
        tokio::task::block_in_place(|| handle.block_on(damage(&client, id, d)));
        true
    };
    conformance::damage_is_detected(&store, "pg", conformance::Links::Events, &edit).await;
}

fn record(id: &str) -> RunRecord {
    let at = chrono::Utc::now();
    RunRecord::new(id, "demo", "running", at)
}

fn warnings(from: u64, n: u64) -> Vec<Event> {
    (from..from + n)
        .map(|seq| {
            NewEvent::level("l1", 1, EventData::Warning(Warning { message: format!("e{seq}") }))
                .at(seq, chrono::Utc::now())
        })
        .collect()
}

/// Two stores are two processes: a run one holds is busy for the other and seen held by
/// it; dropping the guard, or the whole store (its connections close, as when a process
/// dies), lets the other in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_held_by_one_process_and_let_go_when_it_dies() {
    let schema = scratch("hold").await;
    let a = PostgresStore::connect(&schema.url).await.unwrap();
    let b = PostgresStore::connect(&schema.url).await.unwrap();
    let guard = a.hold("r1").await.unwrap();
    assert!(b.is_held("r1").await.unwrap(), "another process sees the hold");
    assert!(matches!(b.hold("r1").await, Err(Error::Busy(_))));
    drop(guard);
    // The unlock reaches the server through the lock connection's queue.
    let mut free = false;
    for _ in 0..100 {
        if !b.is_held("r1").await.unwrap() {
            free = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(free, "a dropped guard lets go");
    drop(b);
    // A process that dies holding r1: a runtime of its own, shut down with the guard held
    // (its connections close with it, as a killed process's do).
    let url = schema.url.clone();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let dying = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let store = PostgresStore::connect(&url).await.unwrap();
            let guard = store.hold("r1").await.unwrap();
            held_tx.send(()).unwrap();
            let _ = die_rx.recv();
            std::mem::forget((guard, store));
        });
        runtime.shutdown_background();
    });
    held_rx.recv().unwrap();
    assert!(matches!(a.hold("r1").await, Err(Error::Busy(_))), "the other process holds it");
    die_tx.send(()).unwrap();
    dying.join().unwrap();
    let mut free = false;
    for _ in 0..200 {
        if a.hold("r1").await.is_ok() {
            free = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(free, "a dead holder's runs are free");
}

/// An append in one process wakes a waiter in another at once (LISTEN/NOTIFY), well
/// before the waiter's fallback look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_in_one_process_wakes_a_waiter_in_another() {
    let schema = scratch("notify").await;
    let a = PostgresStore::connect(&schema.url).await.unwrap();
    let b = PostgresStore::connect(&schema.url).await.unwrap();
    a.create_run(&record("w1"), warnings(1, 1)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let woke = b.wait_for_events("w1", 1, std::time::Duration::from_secs(10)).await.unwrap();
        (woke, started.elapsed())
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    a.append("w1", 2, warnings(2, 1), "running").await.unwrap();
    let (woke, after) = waiting.await.unwrap();
    assert!(woke);
    assert!(after < std::time::Duration::from_secs(2), "woken in {after:?}");
}

/// A run's notifier (what a running step watches for steering and cancels) wakes on another
/// process's append to that run, and not on appends to other runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_notifier_wakes_on_another_process_append_to_that_run_only() {
    let schema = scratch("notifier").await;
    let a = PostgresStore::connect(&schema.url).await.unwrap();
    let b = PostgresStore::connect(&schema.url).await.unwrap();
    a.create_run(&record("n1"), warnings(1, 1)).await.unwrap();
    a.create_run(&record("n2"), warnings(1, 1)).await.unwrap();
    let notify = b.notifier("n2").await.expect("PostgreSQL notifies");
    let woken = notify.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    a.append("n1", 2, warnings(2, 1), "running").await.unwrap();
    let early = tokio::time::timeout(std::time::Duration::from_millis(500), woken.as_mut()).await;
    assert!(early.is_err(), "woken by another run's append");
    let started = std::time::Instant::now();
    a.append("n2", 2, warnings(2, 1), "running").await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), woken)
        .await
        .expect("the append to n2 wakes its notifier");
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
}

/// The appends a driver writes in groups — the main path of every held run — notify too:
/// another process's notifier of the run (a follower, a step watching for a cancel) wakes
/// on each, and a run of the same group it does not watch does not wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_written_in_a_group_wakes_another_process_watching_its_run() {
    let schema = scratch("group_notify").await;
    let driver = PostgresStore::connect(&schema.url).await.unwrap();
    let watcher = PostgresStore::connect(&schema.url).await.unwrap();
    let mut guards = Vec::new();
    for id in ["gn1", "gn2"] {
        guards.push(driver.hold(id).await.unwrap());
        driver.create_run(&record(id), warnings(1, 1)).await.unwrap();
    }
    let notify = watcher.notifier("gn1").await.expect("PostgreSQL notifies");
    assert!(watcher.notices_other_processes());
    for seq in 2..=4 {
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        driver.append("gn2", seq, warnings(seq, 1), "running").await.unwrap();
        let other = tokio::time::timeout(std::time::Duration::from_millis(300), woken.as_mut());
        assert!(other.await.is_err(), "woken by an append to another run");
        let started = std::time::Instant::now();
        driver.append("gn1", seq, warnings(seq, 1), "running").await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .unwrap_or_else(|_| panic!("the grouped append {seq} to gn1 woke nobody"));
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
    }
    drop(guards);
}

/// Processes racing to append to one run at the same number: exactly one wins each round,
/// the others are told who advanced the log, and the log stays intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_appends_from_several_processes_make_one_winner_each() {
    let schema = scratch("race").await;
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(std::sync::Arc::new(PostgresStore::connect(&schema.url).await.unwrap()));
    }
    stores[0].create_run(&record("race"), Vec::new()).await.unwrap();
    for round in 1..=20u64 {
        let mut tasks = Vec::new();
        for s in &stores {
            let s = std::sync::Arc::clone(s);
            tasks.push(tokio::spawn(async move {
                s.append("race", round, warnings(round, 1), "running").await
            }));
        }
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => won += 1,
                Err(Error::Conflict { expected, actual, .. }) => {
                    assert_eq!((expected, actual), (round, round + 1));
                }
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        assert_eq!(won, 1, "round {round}");
    }
    let verified = stores[1].verify("race").await.unwrap();
    assert_eq!(verified.last_seq, 20);
}

/// A database at another schema version than the binary's is refused with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_at_another_version_is_refused_naming_both() {
    let schema = scratch("version").await;
    drop(PostgresStore::connect(&schema.url).await.unwrap());
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client.batch_execute("INSERT INTO schema_version (version) VALUES (99)").await.unwrap();
    let refused = PostgresStore::connect(&schema.url).await.unwrap_err().to_string();
    assert!(refused.contains("schema version 99") && refused.contains("newer"), "{refused}");
    client
        .batch_execute("DELETE FROM schema_version; INSERT INTO schema_version VALUES (0)")
        .await
        .unwrap();
    let refused = PostgresStore::connect(&schema.url).await.unwrap_err().to_string();
    assert!(refused.contains("baton migrate"), "{refused}");
}

/// A server that is not there is named in the error, with what to check.
#[tokio::test]
async fn an_unreachable_server_is_reported_with_what_to_check() {
    let refused =
        PostgresStore::connect("postgres://nobody:secret@127.0.0.1:1/nothing").await.unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("127.0.0.1:1") && message.contains("check"), "{message}");
    assert!(!message.contains("secret"), "the password is not shown: {message}");
}

/// A process that stalls past its hold (its runtime blocked, as a stopped process's is):
/// another takes the run over once the hold has run out and appends; when the stalled one
/// wakes, its appends are refused as fenced and its guard's fence refuses writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holders_late_appends_are_fenced_once_another_took_the_run_over() {
    let schema = scratch("fence").await;
    let url = schema.url.clone();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (taken_tx, taken_rx) = std::sync::mpsc::channel::<()>();
    let stalled = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let store = PostgresStore::connect_holding(&url, std::time::Duration::from_secs(3))
                .await
                .unwrap();
            let guard = store.hold("f1").await.unwrap();
            store.create_run(&record("f1"), warnings(1, 1)).await.unwrap();
            let fence = guard.fence().expect("a PostgreSQL hold can run out: it has a fence");
            assert!(fence.check().is_ok(), "a fresh hold is this process's");
            held_tx.send(()).unwrap();
            // The whole runtime stops, its renewals with it, until the other process has
            // taken the run over.
            taken_rx.recv().unwrap();
            let late = store.append("f1", 2, warnings(2, 1), "running").await;
            let refused = fence.check();
            (late, refused)
        })
    });
    held_rx.recv().unwrap();
    let other = PostgresStore::connect_holding(&schema.url, std::time::Duration::from_secs(3))
        .await
        .unwrap();
    assert!(matches!(other.hold("f1").await, Err(Error::Busy(_))), "held while it lasts");
    let started = std::time::Instant::now();
    let guard = loop {
        match other.hold("f1").await {
            Ok(guard) => break guard,
            Err(Error::Busy(_)) => {
                assert!(started.elapsed().as_secs() < 10, "the stalled hold never ran out");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(started.elapsed() >= std::time::Duration::from_secs(2), "not before it ran out");
    other.append("f1", 2, warnings(2, 1), "running").await.unwrap();
    taken_tx.send(()).unwrap();
    let (late, refused) = stalled.join().unwrap();
    assert!(matches!(late, Err(Error::Fenced(ref id)) if id == "f1"), "{late:?}");
    assert!(refused.is_err(), "the stalled process's fence refuses writes");
    other.append("f1", 3, warnings(3, 1), "running").await.unwrap();
    assert_eq!(other.verify("f1").await.unwrap().last_seq, 3);
    drop(guard);
}

/// A driver's appends are built on the end of the log it knows (one statement each); a log
/// damaged under it — its last event's hash, or events cut off — is still refused, and an
/// append by another process in between is a conflict, never written over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_built_on_the_known_end_still_refuse_damage_and_conflicts() {
    let schema = scratch("known").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    let other = PostgresStore::connect(&schema.url).await.unwrap();
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let guard = store.hold("k1").await.unwrap();
    store.create_run(&record("k1"), warnings(1, 2)).await.unwrap();
    for seq in 3..=6 {
        store.append("k1", seq, warnings(seq, 1), "running").await.unwrap();
    }
    assert_eq!(other.verify("k1").await.unwrap().last_seq, 6);
    // Another process appends (an approval, say): the driver's next append conflicts.
    other.append("k1", 7, warnings(7, 1), "running").await.unwrap();
    let stale = store.append("k1", 7, warnings(7, 1), "running").await;
    assert!(matches!(stale, Err(Error::Conflict { expected: 7, actual: 8, .. })), "{stale:?}");
    store.load("k1", 0).await.unwrap();
    store.append("k1", 8, warnings(8, 1), "running").await.unwrap();
    // The stored hash of the last event changes under the driver: refused as damaged.
    client
        .execute("UPDATE events SET hash = decode(repeat('00', 32), 'hex') WHERE run_id = 'k1' AND seq = 8", &[])
        .await
        .unwrap();
    let damaged = store.append("k1", 9, warnings(9, 1), "running").await;
    assert!(matches!(damaged, Err(Error::Damaged { seq: 9, .. })), "{damaged:?}");
    assert_eq!(other.run("k1").await.unwrap().unwrap().last_seq, 8, "nothing was appended");
    drop(guard);
}

/// The appends of runs a process holds, made at the same moment, are written in groups —
/// fewer commits than appends — and a run of a group whose end changed under its driver is
/// refused alone: the others of its group are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_of_many_held_runs_are_written_in_groups_and_a_miss_is_refused_alone() {
    let schema = scratch("group").await;
    let store = std::sync::Arc::new(PostgresStore::connect(&schema.url).await.unwrap());
    let other = PostgresStore::connect(&schema.url).await.unwrap();
    let ids: Vec<String> = (0..40).map(|i| format!("g{i}")).collect();
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(store.hold(id).await.unwrap());
        store.create_run(&record(id), warnings(1, 1)).await.unwrap();
    }
    // Five rounds, each an append to every run at once.
    let before = store.commits();
    for seq in 2..=6 {
        let mut set = tokio::task::JoinSet::new();
        for id in &ids {
            let (store, id) = (std::sync::Arc::clone(&store), id.clone());
            set.spawn(async move { store.append(&id, seq, warnings(seq, 1), "running").await });
        }
        while let Some(done) = set.join_next().await {
            done.unwrap().unwrap();
        }
    }
    let commits = store.commits() - before;
    assert!(commits < 200, "200 appends took {commits} commits: none was grouped");
    // Another process appends to g0 (an approval, say): in the next round g0's driver
    // conflicts and every other run's append is written.
    other.append("g0", 7, warnings(7, 1), "running").await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for id in &ids {
        let (store, id) = (std::sync::Arc::clone(&store), id.clone());
        set.spawn(
            async move { (id.clone(), store.append(&id, 7, warnings(7, 1), "running").await) },
        );
    }
    while let Some(done) = set.join_next().await {
        let (id, result) = done.unwrap();
        if id == "g0" {
            assert!(
                matches!(result, Err(Error::Conflict { expected: 7, actual: 8, .. })),
                "{result:?}"
            );
        } else {
            result.unwrap();
        }
    }
    for id in &ids {
        assert_eq!(other.verify(id).await.unwrap().last_seq, 7, "{id}");
    }
    drop(guards);
}

/// A process that fills a new database analyzes its tables as they double (from 1 024
/// runs), so that the statements its connections planned while the tables were nearly
/// empty — by scanning them — are planned again by key; autovacuum would do it a minute
/// or more later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_filling_a_new_database_analyzes_its_tables_as_they_double() {
    let schema = scratch("growth").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let analyzed = || async {
        client
            .query_one(
                "SELECT analyze_count FROM pg_stat_user_tables
                  WHERE relname = 'runs' AND schemaname = current_schema()",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // Autovacuum kept off this table, so that any analyzing seen is the store's own.
    client.batch_execute("ALTER TABLE runs SET (autovacuum_enabled = false)").await.unwrap();
    let before = analyzed().await;
    for i in 0..1000 {
        store.create_run(&record(&format!("r{i}")), warnings(1, 1)).await.unwrap();
    }
    // Short of 1 024 runs: nothing analyzed yet (the wait gives an early one time to show).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(analyzed().await, before, "analyzed before the table reached 1 024 runs");
    for i in 1000..1030 {
        store.create_run(&record(&format!("r{i}")), warnings(1, 1)).await.unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while analyzed().await == before {
        assert!(std::time::Instant::now() < deadline, "runs not analyzed 20 s after 1 024 runs");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Every wait on the server has a deadline the URL can set: an append on a run whose row
/// another session keeps locked (a process stopped inside a transaction) fails at the
/// lock deadline with a message that says so, instead of waiting for ever; the default
/// deadlines hold where the URL sets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_on_a_row_another_session_keeps_locked_fails_at_the_lock_deadline() {
    let schema = scratch("deadline").await;
    let url = format!("{}%20-clock_timeout%3D300ms", schema.url);
    let store = PostgresStore::connect(&url).await.unwrap();
    store.create_run(&record("d1"), warnings(1, 1)).await.unwrap();
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (mut client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let locker = client.transaction().await.unwrap();
    locker.execute("SELECT 1 FROM runs WHERE run_id = 'd1' FOR UPDATE", &[]).await.unwrap();
    let started = std::time::Instant::now();
    let refused = store.append("d1", 2, warnings(2, 1), "running").await.unwrap_err().to_string();
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(refused.contains("lock timeout") && refused.contains("lock_timeout"), "{refused}");
    locker.rollback().await.unwrap();
    store.append("d1", 2, warnings(2, 1), "running").await.unwrap();
    // Without settings in the URL, a connection runs under the default deadlines.
    let plain = PostgresStore::connect(&schema.url).await.unwrap();
    for (setting, expected) in [
        ("statement_timeout", "1min"),
        ("lock_timeout", "30s"),
        ("idle_in_transaction_session_timeout", "1min"),
    ] {
        assert_eq!(plain.setting(setting).await.unwrap(), expected, "{setting}");
    }
    assert_eq!(store.setting("lock_timeout").await.unwrap(), "300ms");
}

/// Runs a process holds are created in its group statements; one whose idempotency key or
/// id another run has fails that statement, and the slow path names the conflict, while the
/// runs written with it are still created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_runs_are_created_in_groups_and_a_taken_key_is_named() {
    let schema = scratch("groupnew").await;
    let store = std::sync::Arc::new(PostgresStore::connect(&schema.url).await.unwrap());
    let other = PostgresStore::connect(&schema.url).await.unwrap();
    let keyed = |id: &str, key: &str| RunRecord {
        idempotency: Some(KeyClaim {
            key: key.to_owned(),
            request: "r".to_owned(),
            expires_at: chrono::Utc::now() + chrono::Duration::days(1),
        }),
        ..record(id)
    };
    let first = store.hold("k1").await.unwrap();
    store.create_run(&keyed("k1", "job-7"), warnings(1, 2)).await.unwrap();
    // Twenty creations at once: a few statements.
    let ids: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
    let mut guards = Vec::new();
    for id in &ids {
        guards.push(store.hold(id).await.unwrap());
    }
    let before = store.commits();
    let mut set = tokio::task::JoinSet::new();
    for id in &ids {
        let store = std::sync::Arc::clone(&store);
        let run = record(id);
        set.spawn(async move { store.create_run(&run, warnings(1, 3)).await });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap().unwrap();
    }
    let commits = store.commits() - before;
    assert!(commits <= 10, "{commits} commits for 20 runs created at once");
    for id in &ids {
        assert_eq!(other.verify(id).await.unwrap().last_seq, 3, "{id}");
    }
    // A held run with k1's key: the group fails, the slow path names k1.
    guards.push(store.hold("n20").await.unwrap());
    let taken = store.create_run(&keyed("n20", "job-7"), warnings(1, 1)).await;
    assert!(
        matches!(taken, Err(Error::KeyTaken { ref key, ref run_id }) if key == "job-7" && run_id == "k1"),
        "{taken:?}"
    );
    assert!(other.run("n20").await.unwrap().is_none(), "the refused run was not made");
    let again = store.create_run(&record("k1"), warnings(1, 1)).await;
    assert!(matches!(again, Err(Error::Exists(ref id)) if id == "k1"), "{again:?}");
    // Appends on a created run follow in groups, on the end the creation left.
    store.append("n0", 4, warnings(4, 1), "running").await.unwrap();
    assert_eq!(other.verify("n0").await.unwrap().last_seq, 4);
    drop((first, guards));
}

/// A new run's hold is taken by the statement that creates the run: nothing is written
/// before, the run is held by its creator from its first commit (busy for another
/// process, given back with the guard), and an id another process already holds is
/// refused as busy, the run not made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_runs_hold_is_taken_by_its_creation() {
    let schema = scratch("holdnew").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    let other = PostgresStore::connect(&schema.url).await.unwrap();
    let before = store.commits();
    let guard = store.hold_new("h1").await.unwrap();
    assert_eq!(store.commits(), before, "nothing written before the run is made");
    assert!(!other.is_held("h1").await.unwrap(), "no row names the hold yet");
    store.create_run(&record("h1"), warnings(1, 2)).await.unwrap();
    assert_eq!(store.commits() - before, 1, "the run and its hold in one commit");
    assert!(other.is_held("h1").await.unwrap());
    assert!(matches!(other.hold("h1").await, Err(Error::Busy(_))));
    store.append("h1", 3, warnings(3, 1), "running").await.unwrap();
    assert!(guard.fence().unwrap().check().is_ok());
    drop(guard);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let taken = loop {
        match other.hold("h1").await {
            Ok(g) => break g,
            Err(Error::Busy(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("given back, the run is another's to take: {e}"),
        }
    };
    other.append("h1", 4, warnings(4, 1), "running").await.unwrap();
    drop(taken);
    // An id another process holds (it could only be, were ids not new): busy, nothing made.
    let theirs = other.hold("h2").await.unwrap();
    let _mine = store.hold_new("h2").await.unwrap();
    let refused = store.create_run(&record("h2"), warnings(1, 1)).await;
    assert!(matches!(refused, Err(Error::Busy(ref id)) if id == "h2"), "{refused:?}");
    assert!(other.run("h2").await.unwrap().is_none());
    drop(theirs);
}

/// A hold is given back with the process's next group statement: the process that gave it
/// back takes the run again at once (a new epoch, its own row not yet deleted or not), does
/// not count its own row being given back as held, and another process takes the run once
/// the give-back is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_given_back_is_the_givers_to_take_again_at_once() {
    let schema = scratch("giveback").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    let other = PostgresStore::connect(&schema.url).await.unwrap();
    for round in 0..20 {
        let id = format!("g{round}");
        let guard = store.hold_new(&id).await.unwrap();
        store.create_run(&record(&id), warnings(1, 1)).await.unwrap();
        drop(guard);
        assert!(!store.is_held(&id).await.unwrap(), "{id}: its own give-back is not a hold");
        let again = store.hold(&id).await.unwrap();
        store.append(&id, 2, warnings(2, 1), "running").await.unwrap();
        assert!(matches!(other.hold(&id).await, Err(Error::Busy(_))), "{id}: held again");
        drop(again);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while other.is_held(&id).await.unwrap() {
            assert!(std::time::Instant::now() < deadline, "{id}: never given back");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let theirs = other.hold(&id).await.unwrap();
        other.append(&id, 3, warnings(3, 1), "running").await.unwrap();
        drop(theirs);
    }
}

/// The feed never gives a cursor below which a transaction still running may commit: while
/// another session's transaction that wrote first is open, an event committed after it is
/// held back; once it commits, its event comes first and none is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_holds_back_what_an_open_transaction_may_still_precede() {
    use baton_engine::store::{FeedCursor, FeedRef};
    let schema = scratch("feed").await;
    let store = PostgresStore::connect(&schema.url).await.unwrap();
    store.create_run(&record("early"), warnings(1, 1)).await.unwrap();
    store.create_run(&record("late"), warnings(1, 1)).await.unwrap();
    // Other tests' transactions on this server may hold the feed back a while too.
    let settled = |after: FeedCursor, count: usize| {
        let store = &store;
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let feed: Vec<FeedRef> = store.feed(&None, after, 100).await.unwrap();
                if feed.len() >= count || std::time::Instant::now() > deadline {
                    return feed;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    let first = settled(FeedCursor::START, 2).await;
    assert_eq!(first.len(), 2, "{first:?}");
    let seen = first[1].cursor;
    let config: tokio_postgres::Config = schema.url.parse().unwrap();
    let (mut client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let open = client.transaction().await.unwrap();
    open.execute(
        "INSERT INTO events (run_id, seq, at_us, kind, version, level_id, attempt, data, hash)
         VALUES ('early', 2, 0, 'warning', 1, 'l1', 1, '{\"message\":\"slow\"}', NULL)",
        &[],
    )
    .await
    .unwrap();
    store.append("late", 2, warnings(2, 1), "running").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held = store.feed(&None, seen, 100).await.unwrap();
    assert!(held.is_empty(), "the late commit waits for the open transaction: {held:?}");
    open.commit().await.unwrap();
    let after = settled(seen, 2).await;
    let places: Vec<(&str, u64)> = after.iter().map(|r| (r.run_id.as_str(), r.seq)).collect();
    assert_eq!(
        places,
        [("early", 2), ("late", 2)],
        "the slow transaction's event first, none skipped"
    );
    assert!(after.iter().all(|r| r.cursor > seen));
}

/// Every single-column edit of one stored event — its seq, time, kind, level, attempt,
/// schema version, or one byte of its payload — at any event of a run of varied kinds is
/// found by `verify`, which names that very event (PostgreSQL keeps a hash per event).
#[test]
fn verify_names_the_event_of_every_single_column_edit() {
    use proptest::prelude::*;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (schema, store, client) = runtime.block_on(async {
        let schema = scratch("edits").await;
        let store = PostgresStore::connect(&schema.url).await.unwrap();
        let config: tokio_postgres::Config = schema.url.parse().unwrap();
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        (schema, store, client)
    });
    let events = conformance::varied_events();
    let n = events.len();
    let case = std::sync::atomic::AtomicUsize::new(0);
    let config = ProptestConfig { cases: 48, ..ProptestConfig::default() };
    proptest!(config, |(column in 0usize..7, at in 0usize..n, place in 0.0..1.0f64, byte in 0u8..=255)| {
        let id = format!("edit-{}", case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let seq = i64::try_from(at + 1).unwrap();
        let found = runtime.block_on(async {
            let r = RunRecord::new(&id, "demo", "running", chrono::Utc::now());
            store.create_run(&r, events[..2].to_vec()).await.unwrap();
            store.append(&id, 3, events[2..].to_vec(), "running").await.unwrap();
            store.verify(&id).await.unwrap();
            let sql = match column {
                0 => "UPDATE events SET seq = seq + 100 WHERE run_id = $1 AND seq = $2",
                1 => "UPDATE events SET at_us = at_us + 1 WHERE run_id = $1 AND seq = $2",
                2 => "UPDATE events SET kind = CASE WHEN kind = 'warning' THEN 'heartbeat' ELSE 'warning' END WHERE run_id = $1 AND seq = $2",
                3 => "UPDATE events SET level_id = CASE WHEN level_id IS NULL THEN 'other' ELSE NULL END WHERE run_id = $1 AND seq = $2",
                4 => "UPDATE events SET attempt = COALESCE(attempt, 0) + 1 WHERE run_id = $1 AND seq = $2",
                5 => "UPDATE events SET version = 1 WHERE run_id = $1 AND seq = $2",
                _ => "",
            };
            if sql.is_empty() {
                // One byte of the payload text becomes another printable one.
                let row = client
                    .query_one("SELECT data FROM events WHERE run_id = $1 AND seq = $2", &[&id, &seq])
                    .await
                    .unwrap();
                let mut data: Vec<u8> = row.get::<_, String>(0).into_bytes();
                let i = ((place * data.len() as f64) as usize).min(data.len() - 1);
                // Keep the text UTF-8: edit an ASCII byte (the payloads' first bytes are).
                let i = (0..=i).rev().find(|&j| data[j].is_ascii()).unwrap();
                let mut to = b' ' + byte % 95;
                if to == data[i] {
                    to = if to == b'~' { b' ' } else { to + 1 };
                }
                data[i] = to;
                client
                    .execute(
                        "UPDATE events SET data = $3 WHERE run_id = $1 AND seq = $2",
                        &[&id, &seq, &String::from_utf8(data).unwrap()],
                    )
                    .await
                    .unwrap();
            } else {
                let changed = client.execute(sql, &[&id, &seq]).await.unwrap();
                assert_eq!(changed, 1, "{sql}");
            }
            store.verify(&id).await
        });
        match found {
            Err(Error::Damaged { run_id, seq: bad, .. }) => {
                prop_assert_eq!(run_id, id);
                prop_assert_eq!(bad, at as u64 + 1, "column {} of event {}", column, at + 1);
            }
            other => prop_assert!(false, "column {column} of event {}: {other:?}", at + 1),
        }
    });
    drop(schema);
}
