//! Webhooks: where a tenant's events are sent, and the outbox of their deliveries.
//!
//! A webhook names a URL, the event types it is sent and its signing secret. When an event
//! of one of those types is appended to a run of the webhook's tenant, a delivery is
//! written into the outbox **in the same transaction** as the event (both stores do it in
//! their append), so an event is never stored without its deliveries nor a delivery without
//! its event. Deliveries are sent by whoever holds their lease (`baton serve`, `baton
//! worker`), each attempt recorded; see the application layer's `webhooks` for the sending.

use baton_engine::event::{Event, EventData, FinalStatus};
use baton_engine::model::BoxFuture;
use baton_engine::store::Error;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

/// Every event type a webhook may be sent, and the event kind each comes from.
pub const TYPES: &[&str] = &[
    "approval.requested",
    "question.asked",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.aborted",
    "wave.decided",
];

/// The columns of `webhooks` both stores read, in this order.
pub(crate) const WEBHOOK_COLUMNS: &str =
    "id, tenant, url, types, secret, previous_secret, previous_until_us, created_us, removed_us";

/// The columns of `webhook_deliveries` both stores read, in this order.
pub(crate) const DELIVERY_COLUMNS: &str =
    "id, webhook_id, run_id, seq, type, body, created_us, next_us, attempts, state, last_error";

/// Largest delivery body: past it the event's payload is left out (the body says where to
/// read it).
pub const BODY_BYTES_MAX: usize = 64 * 1024;

/// The webhook type of an event, for the kinds webhooks are sent.
pub fn webhook_type(event: &Event) -> Option<&'static str> {
    match &event.data {
        EventData::ApprovalRequested(_) => Some("approval.requested"),
        EventData::AskUser(_) => Some("question.asked"),
        EventData::ScenarioFinished(f) => Some(match f.status {
            FinalStatus::Completed => "run.completed",
            FinalStatus::Failed => "run.failed",
            FinalStatus::Cancelled => "run.cancelled",
            FinalStatus::Aborted => "run.aborted",
        }),
        EventData::WaveDecided(_) => Some("wave.decided"),
        _ => None,
    }
}

/// A delivery's body (Standard Webhooks' `type`, `timestamp`, `data`): the run, the
/// event's place in its log and its payload (left out past [`BODY_BYTES_MAX`]).
pub fn body(kind: &str, run_id: &str, tenant: Option<&str>, event: &Event) -> String {
    let mut data = json!({
        "run_id": run_id,
        "tenant": tenant,
        "seq": event.seq,
        "kind": event.data.kind(),
        "level_id": event.level_id,
        "attempt": event.attempt,
        "payload": event.data.payload(),
    });
    let whole = json!({"type": kind, "timestamp": event.at.to_rfc3339(), "data": data.clone()});
    let text = whole.to_string();
    if text.len() <= BODY_BYTES_MAX {
        return text;
    }
    data["payload"] = serde_json::Value::Null;
    data["payload_omitted"] = json!(format!(
        "the payload is {} bytes; read event {} of run {run_id} (`baton events`, GET /runs/{{id}}/events)",
        text.len(),
        event.seq
    ));
    json!({"type": kind, "timestamp": event.at.to_rfc3339(), "data": data}).to_string()
}

/// The id of the delivery of event `seq` of `run_id` to `webhook_id`: the same for every
/// attempt (a receiver deduplicates on it), never another delivery's.
pub fn delivery_id(webhook_id: &str, run_id: &str, seq: u64) -> String {
    format!("msg_{webhook_id}_{run_id}_{seq}")
}

/// A webhook as it is stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WebhookRecord {
    /// `wh_` and 12 hex digits.
    pub id: String,
    /// The tenant whose runs it is sent (none: runs of no tenant).
    pub tenant: Option<String>,
    pub url: String,
    /// The event types it is sent, from [`TYPES`].
    pub types: Vec<String>,
    /// The signing secret (`whsec_` and base64), shown once when made or rotated.
    #[serde(skip)]
    pub secret: String,
    /// The secret before the last rotation, which signs too until `previous_until`.
    #[serde(skip)]
    pub previous_secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed_at: Option<DateTime<Utc>>,
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet; tried again at `next_at`.
    Pending,
    /// A 2xx answer was received.
    Delivered,
    /// Given up: the retry bound passed, or the webhook was removed.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        match s {
            "pending" => Some(DeliveryState::Pending),
            "delivered" => Some(DeliveryState::Delivered),
            "failed" => Some(DeliveryState::Failed),
            _ => None,
        }
    }
}

/// One event to send to one webhook.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Delivery {
    /// The message id (`webhook-id`): the same on every attempt.
    pub id: String,
    pub webhook_id: String,
    pub run_id: String,
    pub seq: u64,
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip)]
    pub body: String,
    pub created_at: DateTime<Utc>,
    /// When it is (or was last) due.
    pub next_at: DateTime<Utc>,
    pub attempts: u32,
    pub state: DeliveryState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One try at sending a delivery.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Attempt {
    pub delivery_id: String,
    /// 1 for the first.
    pub attempt: u32,
    pub at: DateTime<Utc>,
    /// The receiver's HTTP status, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why it failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

/// A delivery with every attempt at it.
pub type DeliveryLog = (Delivery, Vec<Attempt>);

/// What comes after an attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum AfterAttempt {
    Delivered,
    /// Tried again at this time.
    RetryAt(DateTime<Utc>),
    /// Given up, and why.
    GiveUp(String),
}

/// A delivery claimed for sending, with its webhook's URL and secrets.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    pub delivery: Delivery,
    pub webhook: WebhookRecord,
}

/// Where webhooks and their deliveries are kept (both stores, beside the runs).
pub trait WebhookStore: Send + Sync {
    /// Keeps a new webhook, unless its tenant already has `per_tenant` live ones (false).
    fn put_webhook<'a>(
        &'a self,
        webhook: &'a WebhookRecord,
        per_tenant: usize,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// The webhook with this id, removed or not.
    fn webhook<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<WebhookRecord>, Error>>;
    /// Every live webhook, oldest first (callers keep those of one tenant).
    fn webhooks(&self) -> BoxFuture<'_, Result<Vec<WebhookRecord>, Error>>;
    /// Removes a webhook at `at`: it is sent nothing more, and its pending deliveries fail.
    /// False when there is no such live webhook.
    fn remove_webhook<'a>(
        &'a self,
        id: &'a str,
        at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// Replaces a live webhook's secret with `secret`; the old one signs too until
    /// `previous_until`. False when there is no such live webhook.
    fn rotate_webhook<'a>(
        &'a self,
        id: &'a str,
        secret: &'a str,
        previous_until: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// Takes the lease of at most `max` deliveries due at `now` (pending, `next_at` passed,
    /// no live lease) for `owner` until `until`, oldest first, with their webhooks.
    fn claim_deliveries<'a>(
        &'a self,
        owner: &'a str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> BoxFuture<'a, Result<Vec<Claimed>, Error>>;
    /// Records an attempt and what follows it, if `owner` still holds the delivery's lease
    /// (false: another sender took it over; nothing is written).
    fn record_attempt<'a>(
        &'a self,
        owner: &'a str,
        attempt: &'a Attempt,
        after: &'a AfterAttempt,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// A webhook's deliveries, newest first (at most `limit`), each with its attempts.
    fn deliveries<'a>(
        &'a self,
        webhook_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryLog>, Error>>;
}

/// The deliveries an appended batch causes: for each event of a webhook type, its type and
/// body (the store inserts one delivery per matching live webhook of the run's tenant).
pub fn outbox<'e>(
    run_id: &str,
    tenant: Option<&str>,
    events: &'e [Event],
) -> Vec<(&'e Event, &'static str, String)> {
    events
        .iter()
        .filter_map(|e| webhook_type(e).map(|kind| (e, kind, body(kind, run_id, tenant, e))))
        .collect()
}

/// Whether a batch holds an event webhooks are sent (a cheap test before the store looks
/// up the run's tenant).
pub fn causes_deliveries(events: &[Event]) -> bool {
    events.iter().any(|e| webhook_type(e).is_some())
}

/// What every store's webhooks must do, run by each store's tests.
pub mod conformance {
    use baton_engine::event::{
        ApprovalRequested, EventData, FinalStatus, NewEvent, ScenarioFinished, Warning,
    };
    use baton_engine::store::{EventStore, RunRecord};
    use chrono::Utc;

    use super::{AfterAttempt, Attempt, DeliveryState, WebhookRecord, WebhookStore};

    fn webhook(id: &str, tenant: Option<&str>, types: &[&str]) -> WebhookRecord {
        WebhookRecord {
            id: id.to_owned(),
            tenant: tenant.map(str::to_owned),
            url: format!("https://receiver.example/{id}"),
            types: types.iter().map(|t| (*t).to_owned()).collect(),
            secret: format!("whsec_{id}"),
            previous_secret: None,
            previous_until: None,
            created_at: Utc::now(),
            removed_at: None,
        }
    }

    fn approval() -> EventData {
        EventData::ApprovalRequested(ApprovalRequested {
            request_id: "r1".to_owned(),
            approver_role: "approver".to_owned(),
            question: "Ship it?".to_owned(),
            schema: serde_json::json!({"type": "object"}),
            deadline: None,
            tool: None,
        })
    }

    fn finished() -> EventData {
        EventData::ScenarioFinished(Box::new(ScenarioFinished {
            status: FinalStatus::Completed,
            aborted_reason: None,
            totals: baton_engine::event::Totals::default(),
            checksum: "c".to_owned(),
            final_output: Some("done".to_owned()),
            tree_totals: None,
        }))
    }

    fn warning() -> EventData {
        EventData::Warning(Warning { message: "w".to_owned() })
    }

    /// Deliveries are written with the events that cause them, for the run's tenant's live
    /// webhooks of that type only; leases are exclusive and attempts are recorded only by
    /// their holder; removing a webhook fails its pending deliveries; the cap per tenant
    /// holds; a rotation keeps the old secret beside the new one.
    pub async fn run_all<S: EventStore + WebhookStore>(store: &S, tag: &str) {
        let at = Utc::now();
        let acme = Some("acme");
        assert!(store.put_webhook(&webhook("wh_all", acme, super::TYPES), 3).await.expect("put"));
        assert!(
            store.put_webhook(&webhook("wh_done", acme, &["run.completed"]), 3).await.expect("put")
        );
        assert!(
            store
                .put_webhook(&webhook("wh_other", Some("globex"), super::TYPES), 3)
                .await
                .expect("put")
        );
        assert!(store.put_webhook(&webhook("wh_none", None, super::TYPES), 3).await.expect("put"));
        assert!(
            !store.put_webhook(&webhook("wh_more", acme, super::TYPES), 2).await.expect("put"),
            "the cap per tenant holds"
        );
        // A run of acme: its approval is sent to one webhook, its end to two, its warning to
        // none; the run's creation may hold the approval already.
        let run = format!("{tag}-hooked");
        let record = RunRecord {
            tenant: Some("acme".to_owned()),
            ..RunRecord::new(&run, "s", "running", at)
        };
        let first = vec![
            NewEvent::run(warning()).at(1, at),
            NewEvent::level("ask", 1, approval()).at(2, at),
        ];
        store.create_run(&record, first).await.expect("create");
        store
            .append(
                &run,
                3,
                vec![NewEvent::run(warning()).at(3, at), NewEvent::run(finished()).at(4, at)],
                "completed",
            )
            .await
            .expect("append");
        let all = store.deliveries("wh_all", 10).await.expect("deliveries");
        let mut kinds: Vec<(String, u64)> =
            all.iter().map(|(d, _)| (d.kind.clone(), d.seq)).collect();
        kinds.sort();
        assert_eq!(kinds, [("approval.requested".to_owned(), 2), ("run.completed".to_owned(), 4)]);
        let (d, attempts) = &all[0];
        assert_eq!((d.state, d.attempts, attempts.len()), (DeliveryState::Pending, 0, 0));
        assert_eq!(d.id, super::delivery_id("wh_all", &run, d.seq));
        let body: serde_json::Value = serde_json::from_str(&d.body).expect("a JSON body");
        assert_eq!(body["data"]["run_id"], run.as_str());
        assert_eq!(body["data"]["tenant"], "acme");
        assert_eq!(body["type"], d.kind.as_str());
        assert_eq!(store.deliveries("wh_done", 10).await.expect("deliveries").len(), 1);
        assert!(store.deliveries("wh_other", 10).await.expect("deliveries").is_empty());
        assert!(store.deliveries("wh_none", 10).await.expect("deliveries").is_empty());
        // An append refused (a conflict) writes no delivery.
        assert!(
            store
                .append(&run, 3, vec![NewEvent::run(finished()).at(3, at)], "completed")
                .await
                .is_err()
        );
        assert_eq!(store.deliveries("wh_all", 10).await.expect("deliveries").len(), 2);

        // Two senders claim at once: each delivery goes to one of them.
        let now = Utc::now();
        let until = now + chrono::Duration::seconds(60);
        let (a, b) = tokio::join!(
            store.claim_deliveries("sender-a", now, until, 10),
            store.claim_deliveries("sender-b", now, until, 10)
        );
        let (a, b) = (a.expect("claim"), b.expect("claim"));
        assert_eq!(a.len() + b.len(), 3, "every due delivery, once");
        let mut ids: Vec<String> = a.iter().chain(&b).map(|c| c.delivery.id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 3);
        assert!(
            store.claim_deliveries("sender-c", now, until, 10).await.expect("claim").is_empty()
        );
        let (mine, owner) = if a.is_empty() { (&b[0], "sender-b") } else { (&a[0], "sender-a") };
        assert_eq!(mine.webhook.id, mine.delivery.webhook_id);
        let attempt = Attempt {
            delivery_id: mine.delivery.id.clone(),
            attempt: 1,
            at: now,
            status: None,
            error: Some("connection refused".to_owned()),
            duration_ms: 3,
        };
        let retry = AfterAttempt::RetryAt(now + chrono::Duration::seconds(5));
        assert!(
            !store.record_attempt("sender-z", &attempt, &retry).await.expect("record"),
            "not its lease"
        );
        assert!(store.record_attempt(owner, &attempt, &retry).await.expect("record"));
        assert!(!store.record_attempt(owner, &attempt, &retry).await.expect("record"), "once");
        let second = Attempt { attempt: 2, status: Some(204), error: None, ..attempt.clone() };
        let later = now + chrono::Duration::seconds(6);
        let again = store.claim_deliveries(owner, later, later + chrono::Duration::seconds(60), 10);
        let again = again.await.expect("claim");
        assert!(
            again.iter().any(|c| c.delivery.id == attempt.delivery_id && c.delivery.attempts == 1)
        );
        assert!(
            store.record_attempt(owner, &second, &AfterAttempt::Delivered).await.expect("record")
        );
        let listed = store.deliveries(&mine.delivery.webhook_id, 10).await.expect("deliveries");
        let (d, tries) = listed.iter().find(|(d, _)| d.id == attempt.delivery_id).expect("listed");
        assert_eq!((d.state, d.attempts, tries.len()), (DeliveryState::Delivered, 2, 2));
        assert_eq!(tries[1].status, Some(204));

        // Rotated: the new secret and the old one, until when.
        let until = Utc::now() + chrono::Duration::hours(24);
        assert!(store.rotate_webhook("wh_all", "whsec_new", until).await.expect("rotate"));
        let w = store.webhook("wh_all").await.expect("get").expect("there");
        assert_eq!(
            (w.secret.as_str(), w.previous_secret.as_deref()),
            ("whsec_new", Some("whsec_wh_all"))
        );
        // Removed: sent nothing more, its pending deliveries failed.
        assert!(store.remove_webhook("wh_done", Utc::now()).await.expect("remove"));
        assert!(!store.remove_webhook("wh_done", Utc::now()).await.expect("remove"), "once");
        assert!(!store.rotate_webhook("wh_done", "whsec_x", until).await.expect("rotate"));
        let done = store.deliveries("wh_done", 10).await.expect("deliveries");
        assert!(done.iter().all(|(d, _)| d.state != DeliveryState::Pending), "{done:?}");
        let live: Vec<String> =
            store.webhooks().await.expect("list").into_iter().map(|w| w.id).collect();
        assert!(!live.contains(&"wh_done".to_owned()) && live.contains(&"wh_all".to_owned()));
    }
}
