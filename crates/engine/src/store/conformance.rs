//! The conformance suite: every [`EventStore`](crate::store::EventStore) implementation
//! runs these checks in its own tests. Each function panics with a message on a violation.

use chrono::{TimeZone, Utc};

use crate::chain::{self, GENESIS};
use crate::event::{Event, EventData, NewEvent, Warning};
use crate::store::contract::{EventStore, KeyClaim, RunRecord};
use crate::store::error::Error;

fn record(id: &str) -> RunRecord {
    let at = Utc.timestamp_opt(1_700_000_000, 0).single().unwrap_or_default();
    RunRecord::new(id, "demo", "running", at)
}

/// A claim of `key` by a request digested as `request`, held for a day from now or, when
/// `expired`, a second past.
fn claim(key: &str, request: &str, expired: bool) -> Option<KeyClaim> {
    let expires_at = if expired {
        Utc::now() - chrono::Duration::seconds(1)
    } else {
        Utc::now() + chrono::Duration::days(1)
    };
    Some(KeyClaim { key: key.to_owned(), request: request.to_owned(), expires_at })
}

fn events(from: u64, n: u64) -> Vec<Event> {
    let at = Utc.timestamp_opt(1_700_000_000, 0).single().unwrap_or_default();
    (from..from + n)
        .map(|seq| {
            NewEvent::level(
                "l1",
                1,
                EventData::Warning(Warning { message: format!("event {seq}") }),
            )
            .at(seq, at)
        })
        .collect()
}

/// Runs every check against a store with no runs whose ids start with `prefix`.
pub async fn run_all(store: &dyn EventStore, prefix: &str) {
    append_and_load(store, &format!("{prefix}-a")).await;
    expected_seq_is_enforced(store, &format!("{prefix}-b")).await;
    a_batch_is_all_or_nothing(store, &format!("{prefix}-c")).await;
    a_run_is_created_with_its_first_events(store, &format!("{prefix}-d")).await;
    unknown_runs_are_reported(store, &format!("{prefix}-missing")).await;
    runs_are_listed_by_status(store, prefix).await;
    leases_share_runs_between_workers(store, prefix).await;
    placements_decide_what_is_claimed(store, prefix).await;
    one_driver_at_a_time(store, &format!("{prefix}-h")).await;
    waiting_for_events(store, &format!("{prefix}-w")).await;
    the_chain_is_the_engines(store, &format!("{prefix}-chain")).await;
    one_run_hashes_alike_on_every_store(store, &format!("{prefix}-alike")).await;
    scenario_texts_are_kept_once(store, prefix).await;
    runs_keep_their_links_and_keys(store, prefix).await;
    tenant_overrides_are_kept_per_tenant_and_scenario(store, prefix).await;
    runs_are_paged_newest_first_by_tenant(store, prefix).await;
    purged_runs_are_gone(store, prefix).await;
    the_feed_follows_every_run_in_commit_order(store, prefix).await;
}

/// A purged run is gone — its record, its events, its key — and runs not named stay.
async fn purged_runs_are_gone(store: &dyn EventStore, prefix: &str) {
    let (gone, kept) = (format!("{prefix}-purged"), format!("{prefix}-kept"));
    let mut keyed = record(&gone);
    keyed.idempotency = claim(&format!("{prefix}-purged-key"), "r", false);
    store.create_run(&keyed, events(1, 3)).await.expect("create");
    store.create_run(&record(&kept), events(1, 2)).await.expect("create");
    let removed = store.purge(&[gone.clone(), format!("{prefix}-never-was")]).await.expect("purge");
    assert_eq!(removed, 1, "one run named exists");
    assert_eq!(store.run(&gone).await.expect("run"), None);
    assert!(matches!(store.load(&gone, 0).await, Err(Error::NotFound(_))));
    assert_eq!(store.run_by_key(None, &format!("{prefix}-purged-key")).await.expect("key"), None);
    assert_eq!(store.load(&kept, 0).await.expect("the other run stays").len(), 2);
    // The id may be used again: nothing of the old run is left to clash with.
    store.create_run(&record(&gone), events(1, 1)).await.expect("create again");
    assert_eq!(store.load(&gone, 0).await.expect("load").len(), 1);
}

/// Pages of one tenant's runs follow each other newest first with no run twice or
/// missing; filters by scenario and roots hold; other tenants' runs never appear.
async fn runs_are_paged_newest_first_by_tenant(store: &dyn EventStore, prefix: &str) {
    let tenant = format!("{prefix}-pages");
    let base = Utc.timestamp_opt(1_750_000_000, 0).single().unwrap_or_default();
    let mut made = Vec::new();
    for i in 0..5i64 {
        let mut r = record(&format!("{prefix}-page-{i}"));
        r.created_at = base + chrono::Duration::seconds(i);
        r.tenant = Some(tenant.clone());
        if i == 3 {
            r.scenario_id = "other".to_owned();
            r.parent_run_id = Some(format!("{prefix}-page-0"));
            r.root_run_id = Some(format!("{prefix}-page-0"));
        }
        store.create_run(&r, events(1, 1)).await.expect("create a run");
        made.push(r.run_id);
    }
    let mut intruder = record(&format!("{prefix}-page-x"));
    intruder.created_at = base + chrono::Duration::seconds(2);
    intruder.tenant = Some(format!("{prefix}-others"));
    store.create_run(&intruder, events(1, 1)).await.expect("create another tenant's run");
    let mut query = super::RunQuery {
        tenant: Some(Some(tenant.clone())),
        limit: 2,
        ..super::RunQuery::default()
    };
    let mut seen = Vec::new();
    for _ in 0..4 {
        let page = store.runs_page(&query).await.expect("a page");
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        query.after_run = Some(last.run_id.clone());
        seen.extend(page.into_iter().map(|r| r.run_id));
    }
    made.reverse();
    assert_eq!(seen, made, "pages of tenant {tenant}, newest first");
    let only = |q: super::RunQuery| async move {
        let page = store.runs_page(&q).await.expect("a page");
        page.into_iter().map(|r| r.run_id).collect::<Vec<_>>()
    };
    let scenario = super::RunQuery {
        tenant: Some(Some(tenant.clone())),
        scenario_id: Some("other".to_owned()),
        limit: 10,
        ..super::RunQuery::default()
    };
    assert_eq!(only(scenario).await, vec![format!("{prefix}-page-3")]);
    let roots = super::RunQuery {
        tenant: Some(Some(tenant.clone())),
        roots_only: true,
        limit: 10,
        ..super::RunQuery::default()
    };
    assert_eq!(only(roots).await.len(), 4, "the child run is not a root");
}

/// A child's record names its parent and root and a tenant; an idempotency key names one
/// run of its tenant while it holds — a second run with it is refused naming the first,
/// another tenant's run may hold the same key, and an expired claim lets the key go.
async fn runs_keep_their_links_and_keys(store: &dyn EventStore, prefix: &str) {
    let root = format!("{prefix}-root");
    let key = format!("{prefix}-key");
    let mut first = record(&root);
    first.idempotency = claim(&key, "body-1", false);
    first.tenant = Some("acme".to_owned());
    store.create_run(&first, events(1, 1)).await.expect("create a root");
    let mut child = record(&format!("{prefix}-child"));
    child.parent_run_id = Some(root.clone());
    child.root_run_id = Some(root.clone());
    child.tenant = Some("acme".to_owned());
    store.create_run(&child, events(1, 1)).await.expect("create a child");
    let read = store.run(&child.run_id).await.expect("read").expect("the child");
    assert_eq!(read.parent_run_id.as_deref(), Some(root.as_str()));
    assert_eq!(read.root_run_id.as_deref(), Some(root.as_str()));
    assert_eq!(read.tenant.as_deref(), Some("acme"));
    let found = store.run_by_key(Some("acme"), &key).await.expect("by key").expect("the root");
    assert_eq!((found.run_id.as_str(), found.tenant.as_deref()), (root.as_str(), Some("acme")));
    let held = found.idempotency.expect("the root's claim");
    assert_eq!((held.key.as_str(), held.request.as_str()), (key.as_str(), "body-1"));
    assert_eq!(
        store.run_by_key(Some("acme"), &format!("{prefix}-nokey")).await.expect("by key"),
        None
    );
    assert_eq!(store.run_by_key(None, &key).await.expect("by key"), None, "keys are per tenant");
    assert_eq!(store.run_by_key(Some("other"), &key).await.expect("by key"), None);
    let mut second = record(&format!("{prefix}-again"));
    second.idempotency = claim(&key, "body-1", false);
    second.tenant = Some("acme".to_owned());
    match store.create_run(&second, events(1, 1)).await {
        Err(Error::KeyTaken { run_id, .. }) => assert_eq!(run_id, root),
        other => panic!("a second run with key {key} must be refused, got {other:?}"),
    }
    assert_eq!(store.run(&second.run_id).await.expect("read"), None);
    // Another tenant's job, and a job of no tenant, may hold the same key.
    for (n, tenant) in [(1, Some("other")), (2, None)] {
        let mut elsewhere = record(&format!("{prefix}-elsewhere-{n}"));
        elsewhere.idempotency = claim(&key, "body-2", false);
        elsewhere.tenant = tenant.map(str::to_owned);
        store.create_run(&elsewhere, events(1, 1)).await.expect("the same key in another tenant");
        let found = store.run_by_key(tenant, &key).await.expect("by key").expect("its run");
        assert_eq!(found.run_id, elsewhere.run_id);
    }
    // An expired claim is not found, and a new run takes the key from it.
    let stale_key = format!("{prefix}-stale");
    let mut stale = record(&format!("{prefix}-stale-1"));
    stale.idempotency = claim(&stale_key, "old", true);
    store.create_run(&stale, events(1, 1)).await.expect("create with an expired claim");
    assert_eq!(store.run_by_key(None, &stale_key).await.expect("by key"), None);
    let mut fresh = record(&format!("{prefix}-stale-2"));
    fresh.idempotency = claim(&stale_key, "new", false);
    store.create_run(&fresh, events(1, 1)).await.expect("an expired key is free again");
    let found = store.run_by_key(None, &stale_key).await.expect("by key").expect("the new run");
    assert_eq!(found.run_id, fresh.run_id);
    let old = store.run(&stale.run_id).await.expect("read").expect("the old run stays");
    assert_eq!(old.idempotency, None, "the old run let its key go");
    // The keys a tenant holds are counted unexpired only, up to the limit asked.
    let counted = format!("{prefix}-counted");
    for n in 0..3 {
        let mut keyed = record(&format!("{prefix}-counted-{n}"));
        keyed.idempotency = claim(&format!("{prefix}-k{n}"), "r", n == 2);
        keyed.tenant = Some(counted.clone());
        store.create_run(&keyed, events(1, 1)).await.expect("create a keyed run");
    }
    assert_eq!(store.keys_held(Some(&counted), 10).await.expect("count"), 2);
    assert_eq!(store.keys_held(Some(&counted), 1).await.expect("count"), 1, "bounded");
    assert_eq!(store.keys_held(Some(&format!("{prefix}-nobody")), 10).await.expect("count"), 0);
}

/// Overrides are stored per tenant and scenario, replaced by a later one, listed by
/// tenant and removed.
async fn tenant_overrides_are_kept_per_tenant_and_scenario(store: &dyn EventStore, prefix: &str) {
    let at = Utc.timestamp_opt(1_700_000_000, 0).single().unwrap_or_default();
    let tenant = format!("{prefix}-t");
    let other = format!("{prefix}-u");
    let o = |tenant: &str, scenario: &str, yaml: &str| super::TenantOverride {
        tenant: tenant.to_owned(),
        scenario_id: scenario.to_owned(),
        yaml: yaml.to_owned(),
        updated_at: at,
    };
    store.put_tenant_override(&o(&tenant, "qa", "a: 1\n")).await.expect("put");
    store.put_tenant_override(&o(&tenant, "qa", "a: 2\n")).await.expect("put");
    store.put_tenant_override(&o(&tenant, "build", "b: 1\n")).await.expect("put");
    store.put_tenant_override(&o(&other, "qa", "c: 1\n")).await.expect("put");
    let mine = store.tenant_overrides(Some(&tenant)).await.expect("list");
    let got: Vec<(&str, &str)> =
        mine.iter().map(|o| (o.scenario_id.as_str(), o.yaml.as_str())).collect();
    assert_eq!(got, [("build", "b: 1\n"), ("qa", "a: 2\n")]);
    assert!(store.tenant_overrides(None).await.expect("list").len() >= 3);
    assert!(store.remove_tenant_override(&tenant, "qa").await.expect("remove"));
    assert!(!store.remove_tenant_override(&tenant, "qa").await.expect("remove"));
    assert_eq!(store.tenant_overrides(Some(&tenant)).await.expect("list").len(), 1);
    assert_eq!(store.tenant_overrides(Some(&other)).await.expect("list").len(), 1);
}

/// A scenario version's texts are kept under its checksum by the first writer; a
/// second write of the same checksum changes nothing and says so.
async fn scenario_texts_are_kept_once(store: &dyn EventStore, prefix: &str) {
    let sum = format!("{prefix}-sum");
    assert_eq!(store.scenario_texts(&sum).await.expect("scenario texts"), None);
    assert!(store.put_scenario_texts(&sum, "qa", "{\"first\":1}").await.expect("scenario texts"));
    assert!(!store.put_scenario_texts(&sum, "qa", "{\"second\":2}").await.expect("scenario texts"));
    assert_eq!(
        store.scenario_texts(&sum).await.expect("scenario texts").as_deref(),
        Some("{\"first\":1}")
    );
    let other = format!("{prefix}-other");
    assert!(store.put_scenario_texts(&other, "qa", "{}").await.expect("scenario texts"));
    assert_eq!(store.scenario_texts(&other).await.expect("scenario texts").as_deref(), Some("{}"));
    assert_eq!(
        store.scenario_texts(&sum).await.expect("scenario texts").as_deref(),
        Some("{\"first\":1}")
    );
}

/// One edit of a stored log, as a bad disk, a careless hand or a bug in a store makes
/// it. Each store's tests apply it to their own storage, past the store's checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Event `n` is deleted.
    Delete(u64),
    /// Events `a` and `b` trade places (each takes the other's number).
    Swap(u64, u64),
    /// Event `n`'s payload is changed (its content, not only its layout).
    Payload(u64),
    /// Event `n` is renumbered to `m` (past the end of the log).
    Renumber(u64, u64),
    /// Event `n`'s time moves by a second.
    Time(u64),
    /// Event `n`'s kind is changed to `heartbeat`.
    Kind(u64),
    /// Event `n`'s level id is changed.
    Level(u64),
    /// Event `n`'s attempt is changed.
    Attempt(u64),
    /// Event `n`'s schema version is changed (to 1, under which a warning reads the same).
    Version(u64),
    /// Event `n`'s stored hash is changed.
    Hash(u64),
    /// The run's `last_seq` is set to `n`, events untouched.
    LastSeq(u64),
    /// Every event after `n` is deleted and `last_seq` set to `n`: only the head hash
    /// tells.
    Truncate(u64),
}

impl Damage {
    /// Every kind of damage to a log of [`DAMAGED_LOG_LEN`] events, with the first bad
    /// event each must be reported at.
    pub fn all() -> Vec<(Damage, u64)> {
        vec![
            (Damage::Delete(3), 3),
            (Damage::Delete(DAMAGED_LOG_LEN), DAMAGED_LOG_LEN),
            (Damage::Swap(2, 4), 2),
            (Damage::Payload(3), 3),
            (Damage::Renumber(3, 9), 3),
            (Damage::Time(3), 3),
            (Damage::Kind(3), 3),
            (Damage::Level(3), 3),
            (Damage::Attempt(3), 3),
            (Damage::Version(3), 3),
            (Damage::Hash(3), 3),
            (Damage::LastSeq(DAMAGED_LOG_LEN + 2), DAMAGED_LOG_LEN + 1),
            (Damage::LastSeq(DAMAGED_LOG_LEN - 1), DAMAGED_LOG_LEN),
            (Damage::Truncate(3), 4),
        ]
    }
}

/// Events in each run [`damage_is_detected`] damages.
pub const DAMAGED_LOG_LEN: u64 = 5;

/// What a store's hashes link: every event, or each commit batch (then damage is
/// reported at the first event of the first batch whose hash no longer holds). The
/// damaged runs are written as two batches: events 1–2, then 3 to the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    Events,
    Batches,
}

impl Links {
    /// The case of [`Damage::all`] as it applies to such a store: the damage, and where
    /// it is reported. A batch's hash vouches for all of its events at once, so a cut
    /// of the log is made at the end of a batch (a cut inside one is found by a load,
    /// not by the cheap look at the end an append takes).
    fn case(self, damage: Damage, seq: u64) -> (Damage, u64) {
        match (self, damage) {
            (Links::Events, d) | (Links::Batches, d @ Damage::LastSeq(_)) => (d, seq),
            (Links::Batches, Damage::Truncate(_)) => (Damage::Truncate(2), 3),
            (Links::Batches, d) if seq <= 2 => (d, 1),
            (Links::Batches, d) => (d, seq.min(3)),
        }
    }
}

/// Damages one fresh run per kind of [`Damage`] with `edit` (which changes the store's
/// storage directly, given the run id, and says false for a field the store does not
/// keep) and checks that loading, verifying and appending all refuse, naming the run and
/// the first bad event.
pub async fn damage_is_detected(
    store: &dyn EventStore,
    prefix: &str,
    links: Links,
    edit: &(dyn Fn(&str, Damage) -> bool + Sync),
) {
    for (i, (damage, first_bad)) in Damage::all().into_iter().enumerate() {
        let (damage, first_bad) = links.case(damage, first_bad);
        let id = format!("{prefix}-damage-{i}");
        store.create_run(&record(&id), events(1, 2)).await.expect("create");
        store.append(&id, 3, events(3, DAMAGED_LOG_LEN - 2), "paused").await.expect("append");
        store.load(&id, 0).await.expect("an intact log loads");
        if !edit(&id, damage) {
            continue;
        }
        let refused = |what: &str, got: Result<(), Error>| match got {
            Err(Error::Damaged { run_id, seq, problem }) => {
                assert_eq!(run_id, id, "{damage:?}: {what} names the run");
                assert_eq!(
                    seq, first_bad,
                    "{damage:?}: {what} names the first bad event ({problem})"
                );
            }
            other => panic!("{damage:?}: {what} must refuse a damaged log, got {other:?}"),
        };
        refused("a whole load", store.load(&id, 0).await.map(|_| ()));
        refused("verify", store.verify(&id).await.map(|_| ()));
        refused("a load after event 1", store.load(&id, 1).await.map(|_| ()));
        let before = store.run(&id).await.expect("run").expect("exists");
        if matches!(
            damage,
            Damage::LastSeq(_) | Damage::Truncate(_) | Damage::Delete(DAMAGED_LOG_LEN)
        ) {
            // The end of the log is what an append builds on: it refuses there too.
            let next = before.last_seq + 1;
            let got = store.append(&id, next, events(next, 1), "running").await;
            assert!(
                matches!(&got, Err(Error::Damaged { run_id, .. }) if *run_id == id),
                "{damage:?}: an append on a damaged end must refuse, got {got:?}"
            );
            let after = store.run(&id).await.expect("run").expect("exists");
            assert_eq!(after.last_seq, before.last_seq, "{damage:?}: nothing was appended");
        }
    }
}

/// Events of many kinds with what an encoding can get wrong: floats, escapes, non-ASCII
/// and line separators, a sha256 in hex, a long text repeated, nested JSON with its keys
/// out of order, an empty object, a time, an absent field and a null one.
pub fn varied_events() -> Vec<Event> {
    let at = Utc.timestamp_opt(1_700_000_000, 123_456_000).single().unwrap_or_default();
    let long = "A long answer repeated word for word: ".repeat(4);
    let hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let payloads = [
        ("warning", r#"{"message": "tab\t quote\" slash\\ \u2028 é 日本 \u0001"}"#.to_owned()),
        (
            "model_response",
            format!(
                r#"{{"provider": "scripted", "model": "m", "request_hash": "{hex}", "call": 1, "text": "{long}", "tool_calls": [], "usage": {{"input_tokens": 12, "output_tokens": 3400000000}}, "cost_usd": 0.1}}"#
            ),
        ),
        (
            "tool_call",
            r#"{"call_id": "c1", "tool": "write_file", "arguments": {"z": [1, -2, 2.5e-7, 1e300, 0.0], "a": {"y": null, "b": true}, "m": {}}}"#
                .to_owned(),
        ),
        (
            "approval_requested",
            r#"{"request_id": "r1", "approver_role": "lead", "question": "Ship it?", "schema": {"type": "object", "required": ["why"]}, "deadline": "2026-12-07T10:00:00.5Z"}"#
                .to_owned(),
        ),
        (
            "approval_decided",
            r#"{"request_id": "r1", "approved": true, "comment": null, "by": "ana", "data": {"why": "tests pass", "n": 3}}"#
                .to_owned(),
        ),
        ("warning", format!(r#"{{"message": "{long}"}}"#)),
    ];
    payloads
        .iter()
        .zip(1..)
        .map(|((kind, json), seq)| {
            let data = EventData::decode_str(kind, crate::event::VERSION, json)
                .unwrap_or_else(|e| panic!("fixture event {seq}: {e}"));
            let level = (seq % 2 == 0).then_some("review");
            NewEvent { level_id: level.map(str::to_owned), attempt: level.map(|_| 2), data }
                .at(seq, at + chrono::Duration::microseconds(i64::try_from(seq).unwrap_or(0)))
        })
        .collect()
}

/// The head every store must reach for [`varied_events`]: the same on memory, SQLite and
/// PostgreSQL, and the same in every build (a log written by one build verifies in the
/// next; a change here would strand every run stored in the encoded form).
pub const VARIED_HEAD: &str = "d239f36d47b18ced7064cbbeb1b5aba936683c0fcb20b7dc22e6438702f416ab";

/// One run, written in two batches, hashes to [`VARIED_HEAD`] on this store, and loads
/// back as it was written.
async fn one_run_hashes_alike_on_every_store(store: &dyn EventStore, id: &str) {
    let events = varied_events();
    store.create_run(&record(id), events[..2].to_vec()).await.expect("create");
    store.append(id, 3, events[2..].to_vec(), "running").await.expect("append");
    let verified = store.verify(id).await.expect("an intact run verifies");
    assert_eq!(verified.form, chain::Form::Encoded, "a run created today takes the encoded form");
    assert_eq!(chain::hex(&verified.head), VARIED_HEAD, "the head of the varied run");
    assert_eq!(
        chain::hashes(GENESIS, &events).last().map(chain::hex).as_deref(),
        Some(VARIED_HEAD)
    );
    assert_eq!(store.load(id, 0).await.expect("load"), events);
    assert_eq!(store.load(id, 3).await.expect("load after 3"), events[3..].to_vec());
}

/// The chain a store keeps is the engine's, over the logical form of the events: two
/// stores holding the same events hold the same hashes.
async fn the_chain_is_the_engines(store: &dyn EventStore, id: &str) {
    store.create_run(&record(id), Vec::new()).await.expect("create");
    let empty = store.verify(id).await.expect("an empty run is intact");
    assert_eq!((empty.last_seq, empty.head), (0, GENESIS));
    store.append(id, 1, events(1, 2), "running").await.expect("append");
    store.append(id, 3, events(3, 3), "running").await.expect("append");
    let verified = store.verify(id).await.expect("an intact run verifies");
    let expected = chain::hashes(GENESIS, &events(1, 5));
    assert_eq!(verified.last_seq, 5);
    assert_eq!(
        chain::hex(&verified.head),
        chain::hex(&expected[4]),
        "the head is the engine's hash of the last event"
    );
    assert_eq!(store.load(id, 2).await.expect("partial load"), events(3, 3));
    assert_eq!(store.load(id, 5).await.expect("load at the end"), Vec::new());
    assert_eq!(store.load(id, 9).await.expect("load past the end"), Vec::new());
}

async fn one_driver_at_a_time(store: &dyn EventStore, run_id: &str) {
    assert!(!store.is_held(run_id).await.expect("is_held"), "nobody holds a new run");
    let first = store.hold(run_id).await.expect("a free run can be held");
    assert!(store.is_held(run_id).await.expect("is_held"), "a held run is held");
    assert!(store.is_held(run_id).await.expect("is_held"), "asking does not let go");
    match store.hold(run_id).await {
        Err(Error::Busy(id)) => assert_eq!(id, run_id),
        other => panic!("a held run is busy, got {other:?}"),
    }
    let other = store.hold(&format!("{run_id}-other")).await.expect("other runs are free");
    drop(first);
    assert!(!store.is_held(run_id).await.expect("is_held"), "a dropped guard lets go");
    let again = store.hold(run_id).await.expect("a run is free once its guard is dropped");
    drop((again, other));
}

async fn leases_share_runs_between_workers(store: &dyn EventStore, prefix: &str) {
    use chrono::Duration;
    // Only runs whose status is `running` can be claimed; take every one there is.
    let t0 = Utc.timestamp_opt(1_800_000_000, 0).single().unwrap_or_default();
    let any = crate::store::Claimable::default();
    let mut claimed = Vec::new();
    while let Some(run) =
        store.claim("w1", t0, t0 + Duration::seconds(30), &any).await.expect("claim")
    {
        assert!(!claimed.contains(&run.run_id), "a run is leased once");
        assert_eq!(run.status, "running");
        claimed.push(run.run_id);
        assert!(claimed.len() < 1000, "claim must run out of runs");
    }
    assert!(claimed.iter().any(|id| id.starts_with(prefix)), "{claimed:?}");
    let mine = &claimed[0];
    assert!(
        store
            .claim("w2", t0 + Duration::seconds(10), t0 + Duration::seconds(40), &any)
            .await
            .expect("claim")
            .is_none(),
        "leased runs are not claimable"
    );
    assert!(
        store
            .renew(mine, "w1", t0 + Duration::seconds(20), t0 + Duration::seconds(60))
            .await
            .expect("renew")
    );
    assert!(
        !store
            .renew(mine, "w2", t0 + Duration::seconds(20), t0 + Duration::seconds(60))
            .await
            .expect("renew"),
        "only the holder renews"
    );
    // After the lease runs out, another worker takes the run over.
    let later = t0 + Duration::seconds(61);
    let taken = store
        .claim("w2", later, later + Duration::seconds(30), &any)
        .await
        .expect("claim")
        .expect("an expired lease frees the run");
    assert!(
        !store
            .renew(&taken.run_id, "w1", later, later + Duration::seconds(30))
            .await
            .expect("renew"),
        "a lost lease cannot be renewed"
    );
    store.release(&taken.run_id, "w2").await.expect("release");
    let again = store.claim("w3", later, later + Duration::seconds(30), &any).await.expect("claim");
    assert_eq!(again.map(|r| r.run_id), Some(taken.run_id), "a released run is claimable at once");
}

/// A claim takes only runs of the queues it names, due first (a higher priority moves a
/// run's due time earlier), and never a run whose job has a workspace on another home; the
/// placement is kept as it was given, with the due time the store worked out. (The runs of
/// the tests before are leased until after `now`.)
async fn placements_decide_what_is_claimed(store: &dyn EventStore, prefix: &str) {
    use crate::store::{AGING_S_DEFAULT, Claimable, Placement};
    use chrono::Duration;
    let t0 = Utc.timestamp_opt(1_800_000_000, 0).single().unwrap_or_default();
    let placed = |id: &str, created: i64, placement: Placement| RunRecord {
        placement,
        ..RunRecord::new(id, "demo", "running", t0 + Duration::seconds(created))
    };
    let low = format!("{prefix}-low");
    let high = format!("{prefix}-high");
    let away = format!("{prefix}-away");
    store.create_run(&placed(&low, 0, Placement::default()), events(1, 1)).await.expect("low");
    let urgent = Placement { priority: 9, ..Placement::default() };
    store.create_run(&placed(&high, 10, urgent.clone()), events(1, 1)).await.expect("high");
    let elsewhere = Placement { home: Some("elsewhere".to_owned()), ..Placement::default() };
    store.create_run(&placed(&away, -10, elsewhere), events(1, 1)).await.expect("away");
    let kept = store.run(&high).await.expect("run").expect("kept").placement;
    let aging = Duration::seconds(i64::try_from(AGING_S_DEFAULT).unwrap_or_default());
    assert_eq!(kept, Placement { due_at: Some(t0 + Duration::seconds(10) - aging), ..urgent });
    let now = t0 + Duration::seconds(20);
    let until = now + Duration::seconds(5);
    let other = Claimable { queues: vec!["nothing".to_owned()], home: Some("here".to_owned()) };
    assert_eq!(store.claim("w1", now, until, &other).await.expect("claim"), None);
    let here = Claimable { queues: vec![], home: Some("here".to_owned()) };
    let first = store.claim("w1", now, until, &here).await.expect("claim").map(|r| r.run_id);
    let second = store.claim("w1", now, until, &here).await.expect("claim").map(|r| r.run_id);
    let third = store.claim("w1", now, until, &here).await.expect("claim").map(|r| r.run_id);
    assert_eq!(
        [first, second, third],
        [Some(high), Some(low), None],
        "due first, and never a run on another home"
    );
    let there =
        Claimable { queues: vec!["default".to_owned()], home: Some("elsewhere".to_owned()) };
    let taken = store.claim("w2", now, until, &there).await.expect("claim").map(|r| r.run_id);
    assert_eq!(taken, Some(away), "a process on the run's home takes it");
}

async fn waiting_for_events(store: &dyn EventStore, id: &str) {
    store.create_run(&record(id), events(1, 1)).await.expect("create");
    let quiet =
        store.wait_for_events(id, 1, std::time::Duration::from_millis(60)).await.expect("wait");
    assert!(!quiet, "no new event: the wait times out");
    store.append(id, 2, events(2, 1), "running").await.expect("append");
    assert!(store.wait_for_events(id, 1, std::time::Duration::from_secs(5)).await.expect("wait"));
}

/// Checks, on a store reopened after [`run_all`], that every committed event is there.
pub async fn reopened(store: &dyn EventStore, prefix: &str) {
    let id = format!("{prefix}-a");
    let all = store.load(&id, 0).await.expect("load after reopening");
    assert_eq!(all, [events(1, 3), events(4, 2)].concat(), "a reopened store keeps every event");
    assert_eq!(store.run(&id).await.expect("run").expect("run exists").status, "paused");
    let chained = store.verify(&format!("{prefix}-chain")).await.expect("verify");
    let expected = chain::hashes(GENESIS, &events(1, 5));
    assert_eq!(chained.head, expected[4], "a reopened store keeps the head hash");
}

async fn append_and_load(store: &dyn EventStore, id: &str) {
    store.create_run(&record(id), Vec::new()).await.expect("create run");
    assert!(
        matches!(store.create_run(&record(id), Vec::new()).await, Err(Error::Exists(_))),
        "a second create must fail"
    );
    store.append(id, 1, events(1, 3), "running").await.expect("append 1..=3");
    store.append(id, 4, events(4, 2), "paused").await.expect("append 4..=5");
    let all = store.load(id, 0).await.expect("load");
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert_eq!(all, [events(1, 3), events(4, 2)].concat(), "events come back as written");
    let tail = store.load(id, 3).await.expect("load tail");
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    let run = store.run(id).await.expect("run").expect("run exists");
    assert_eq!((run.last_seq, run.status.as_str()), (5, "paused"));
    // Each commit records the process that wrote it.
    let writer = crate::store::writer().to_string();
    let writers = store.writers(id).await.expect("writers");
    assert_eq!(writers, [(1, writer.clone()), (4, writer)], "one writer per batch");
}

async fn expected_seq_is_enforced(store: &dyn EventStore, id: &str) {
    store.create_run(&record(id), Vec::new()).await.expect("create run");
    store.append(id, 1, events(1, 2), "running").await.expect("append");
    let stale = store.append(id, 2, events(2, 1), "running").await;
    assert!(
        matches!(stale, Err(Error::Conflict { expected: 2, actual: 3, .. })),
        "stale append: {stale:?}"
    );
    let ahead = store.append(id, 5, events(5, 1), "running").await;
    assert!(matches!(ahead, Err(Error::Conflict { .. })), "append past the end: {ahead:?}");
    assert_eq!(store.load(id, 0).await.expect("load").len(), 2);
}

async fn a_batch_is_all_or_nothing(store: &dyn EventStore, id: &str) {
    store.create_run(&record(id), Vec::new()).await.expect("create run");
    let mut bad = events(1, 3);
    bad[2].seq = 9;
    assert!(store.append(id, 1, bad, "running").await.is_err(), "a misnumbered batch must fail");
    assert!(store.load(id, 0).await.expect("load").is_empty(), "nothing of a failed batch is kept");
}

async fn a_run_is_created_with_its_first_events(store: &dyn EventStore, id: &str) {
    store.create_run(&record(id), events(1, 2)).await.expect("create with events");
    assert_eq!(store.load(id, 0).await.expect("load"), events(1, 2));
    assert_eq!(store.run(id).await.expect("run").expect("exists").last_seq, 2);
    store.append(id, 3, events(3, 1), "running").await.expect("append after");
    let other = format!("{id}-bad");
    assert!(
        store.create_run(&record(&other), events(2, 1)).await.is_err(),
        "first events start at 1"
    );
    assert!(store.run(&other).await.expect("run").is_none(), "a failed create leaves no run");
}

async fn unknown_runs_are_reported(store: &dyn EventStore, id: &str) {
    assert!(matches!(store.append(id, 1, events(1, 1), "running").await, Err(Error::NotFound(_))));
    assert!(store.run(id).await.expect("run").is_none());
    // A load of a run that does not exist says so: the engine reads a run's state by
    // loading it, without asking for it first.
    assert!(matches!(store.load(id, 0).await, Err(Error::NotFound(_))));
}

async fn runs_are_listed_by_status(store: &dyn EventStore, prefix: &str) {
    let paused = store.runs(Some("paused")).await.expect("list");
    assert!(paused.iter().any(|r| r.run_id == format!("{prefix}-a")));
    assert!(paused.iter().all(|r| r.status == "paused"));
    let all = store.runs(None).await.expect("list");
    assert!(all.len() >= 3);
}

/// The feed gives one tenant's events of every run in the order they were committed, each
/// run's in its own order; pages of any size resumed from any cursor give exactly the rest;
/// other tenants' events never appear in a tenant's feed; a purged run leaves it, and what
/// is committed after gets cursors above every one given before.
async fn the_feed_follows_every_run_in_commit_order(store: &dyn EventStore, prefix: &str) {
    use super::{FeedCursor, FeedRef};
    let tenant = Some(Some(format!("{prefix}-feed")));
    let of_tenant = |id: &str, t: &Option<Option<String>>| {
        let mut r = record(id);
        r.tenant = t.clone().flatten();
        r
    };
    let (a, b, c) =
        (format!("{prefix}-feed-a"), format!("{prefix}-feed-b"), format!("{prefix}-feed-c"));
    store.create_run(&of_tenant(&a, &tenant), events(1, 2)).await.expect("create a");
    store.create_run(&of_tenant(&b, &tenant), events(1, 1)).await.expect("create b");
    let other = Some(Some(format!("{prefix}-feed-other")));
    store.create_run(&of_tenant(&c, &other), events(1, 1)).await.expect("create c");
    store.append(&a, 3, events(3, 2), "running").await.expect("append a");
    store.append(&b, 2, events(2, 1), "running").await.expect("append b");
    let all = |after: FeedCursor, limit: usize| {
        let tenant = &tenant;
        async move { store.feed(tenant, after, limit).await.expect("the feed") }
    };
    // A store may hold back events behind transactions still running elsewhere (another
    // process's, another test's): what is committed shows within a bound.
    let settled = |count: usize| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let feed = all(FeedCursor::START, 100).await;
            if feed.len() >= count || std::time::Instant::now() > deadline {
                return feed;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    let whole = settled(6).await;
    let places: Vec<(String, u64)> = whole.iter().map(|r| (r.run_id.clone(), r.seq)).collect();
    let expected: Vec<(String, u64)> = [(&a, 1), (&a, 2), (&b, 1), (&a, 3), (&a, 4), (&b, 2)]
        .iter()
        .map(|(run, seq)| ((*run).clone(), *seq))
        .collect();
    assert_eq!(places, expected, "the tenant's feed, in commit order");
    assert!(whole.windows(2).all(|w| w[0].cursor < w[1].cursor), "cursors grow: {whole:?}");
    for (i, from) in whole.iter().enumerate() {
        let rest = all(from.cursor, 100).await;
        assert_eq!(rest, whole[i + 1..].to_vec(), "the rest after {}", from.cursor);
    }
    let mut paged: Vec<FeedRef> = Vec::new();
    let mut at = FeedCursor::START;
    for _ in 0..10 {
        let page = all(at, 2).await;
        assert!(page.len() <= 2, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        at = last.cursor;
        paged.extend(page);
    }
    assert_eq!(paged, whole, "pages of two give the same feed");
    let others = store.feed(&other, FeedCursor::START, 100).await.expect("the other tenant");
    assert_eq!(others.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), [c.as_str()]);
    store.purge(std::slice::from_ref(&a)).await.expect("purge a");
    let after_purge = all(FeedCursor::START, 100).await;
    assert!(after_purge.iter().all(|r| r.run_id == b), "a purged run leaves the feed");
    store.append(&b, 3, events(3, 1), "running").await.expect("append b again");
    let newest = settled(3).await;
    let last = newest.last().expect("b's new event");
    assert_eq!((last.run_id.as_str(), last.seq), (b.as_str(), 3));
    assert!(
        whole.iter().all(|r| r.cursor < last.cursor),
        "a new event's cursor is above every old one"
    );
}
