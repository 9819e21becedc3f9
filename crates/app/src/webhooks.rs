//! Webhooks, every use case: add, list, remove, rotate and the deliveries of one
//! (`baton webhook`, the API's `/webhooks`), each scoped to a tenant; and the sender that
//! `baton serve` and `baton worker` run, which sends what the outbox holds under a lease.
//!
//! The outbox is written by the store in the transaction that appends each event (see
//! `baton_store::webhooks`), so a run that only the CLI drove has its deliveries sent by
//! the next server or worker, and a restart loses none. A delivery is tried at once, then
//! after the first backoff (`[webhooks] first_backoff_s`, 10 s by default), each wait twice
//! the one before and at most an hour, until 24 hours after its event; each attempt is
//! recorded, and a 2xx answer ends it. A receiver deduplicates on `webhook-id`, the same on
//! every attempt.

use std::sync::Arc;
use std::time::Duration;

use baton_engine::cancel::CancelToken;
use baton_providers::egress::EgressPolicy;
use baton_providers::webhook::{self, Sent};
use baton_store::webhooks::{
    AfterAttempt, Attempt, Claimed, Delivery, DeliveryLog, TYPES, WebhookRecord, WebhookStore,
};
use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::place::{Place, config_file};

/// Most live webhooks of one tenant.
pub const PER_TENANT_MAX: usize = 16;

/// Most deliveries `deliveries` lists (the newest).
pub const DELIVERIES_LISTED_MAX: usize = 200;

/// How long the secret a rotation replaces goes on signing.
pub const ROTATION_OVERLAP_H: i64 = 24;

/// How long after its event a delivery is tried; then it is given up.
pub const GIVE_UP_AFTER_H: i64 = 24;

/// The longest wait between two attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(3600);

/// How long a sender holds a delivery it claimed (longer than any attempt may take).
pub const LEASE: Duration = Duration::from_secs(120);

/// Most deliveries one sender claims at once.
pub const CLAIM_MAX: usize = 16;

/// How often a sender looks for deliveries that are due.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Longest URL kept.
pub const URL_BYTES_MAX: usize = 2048;

/// How this instance sends webhooks (`[webhooks]` and `[egress]` of `baton.toml`).
#[derive(Clone, Debug)]
pub struct Settings {
    pub first_backoff: Duration,
    pub timeout: Duration,
    pub egress: EgressPolicy,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            first_backoff: Duration::from_secs(10),
            timeout: Duration::from_secs(10),
            egress: EgressPolicy::default(),
        }
    }
}

/// The settings of the configuration at `place` (a file that does not load is an error).
pub fn settings(place: &Place) -> anyhow::Result<Settings> {
    let Some(path) = config_file(place.config.as_deref()) else {
        return Ok(Settings::default());
    };
    let config = baton_providers::config::Config::from_file(&path)?;
    let d = Settings::default();
    Ok(Settings {
        first_backoff: config
            .webhooks
            .first_backoff_s
            .map_or(d.first_backoff, Duration::from_secs_f64),
        timeout: config.webhooks.timeout_s.map_or(d.timeout, Duration::from_secs_f64),
        egress: config.egress,
    })
}

/// A webhook just made or rotated, with its secret: shown this once.
#[derive(Clone, Debug)]
pub struct WithSecret {
    pub webhook: WebhookRecord,
    pub secret: String,
}

/// Keeps a webhook of `tenant` sending `types` (every type when empty) to `url`, checked
/// against the egress policy; refused past [`PER_TENANT_MAX`] live ones.
pub async fn add(
    store: &dyn WebhookStore,
    settings: &Settings,
    tenant: Option<&str>,
    url: &str,
    types: &[String],
    now: DateTime<Utc>,
) -> Result<WithSecret, Error> {
    // A URL this instance will not call is refused as things stand (the egress policy
    // decides), like one that does not parse.
    if url.len() > URL_BYTES_MAX {
        return Err(Error::refused(format!("the URL is longer than {URL_BYTES_MAX} bytes")));
    }
    let parsed = reqwest_url(url)?;
    settings
        .egress
        .check_url(&parsed)
        .map_err(|why| Error::refused(format!("the webhook's URL is refused: {why}")))?;
    let mut chosen: Vec<String> = Vec::new();
    for t in types {
        if !TYPES.contains(&t.as_str()) {
            return Err(Error::invalid(format!(
                "no event type `{t}`; the types are {}",
                TYPES.join(", ")
            )));
        }
        if !chosen.contains(t) {
            chosen.push(t.clone());
        }
    }
    if chosen.is_empty() {
        chosen = TYPES.iter().map(|t| (*t).to_owned()).collect();
    }
    let secret = webhook::new_secret();
    let record = WebhookRecord {
        id: format!("wh_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        tenant: tenant.map(str::to_owned),
        url: parsed.to_string(),
        types: chosen,
        secret: secret.clone(),
        previous_secret: None,
        previous_until: None,
        created_at: now,
        removed_at: None,
    };
    if !store.put_webhook(&record, PER_TENANT_MAX).await? {
        return Err(Error::over_limit(format!(
            "the tenant has {PER_TENANT_MAX} webhooks already; remove one first (`baton webhook rm`)"
        )));
    }
    Ok(WithSecret { webhook: record, secret })
}

fn reqwest_url(url: &str) -> Result<webhook::Url, Error> {
    webhook::Url::parse(url).map_err(|e| {
        Error::refused(format!("the webhook's URL is refused: `{url}` is not a URL: {e}"))
    })
}

/// The live webhooks of `tenant`, oldest first.
pub async fn list(
    store: &dyn WebhookStore,
    tenant: Option<&str>,
) -> Result<Vec<WebhookRecord>, Error> {
    Ok(store.webhooks().await?.into_iter().filter(|w| w.tenant.as_deref() == tenant).collect())
}

/// The live webhook `id` of `tenant`, or not found (another tenant's is not there).
async fn live(
    store: &dyn WebhookStore,
    tenant: Option<&str>,
    id: &str,
) -> Result<WebhookRecord, Error> {
    match store.webhook(id).await? {
        Some(w) if w.tenant.as_deref() == tenant && w.removed_at.is_none() => Ok(w),
        _ => Err(Error::not_found(format!("no webhook {id}"))),
    }
}

/// Removes webhook `id` of `tenant`: nothing more is sent to it, its pending deliveries
/// fail.
pub async fn remove(
    store: &dyn WebhookStore,
    tenant: Option<&str>,
    id: &str,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    live(store, tenant, id).await?;
    if !store.remove_webhook(id, now).await? {
        return Err(Error::not_found(format!("no webhook {id}")));
    }
    Ok(())
}

/// Gives webhook `id` of `tenant` a new secret; the old one signs too for
/// [`ROTATION_OVERLAP_H`] hours.
pub async fn rotate(
    store: &dyn WebhookStore,
    tenant: Option<&str>,
    id: &str,
    now: DateTime<Utc>,
) -> Result<WithSecret, Error> {
    let mut webhook = live(store, tenant, id).await?;
    let secret = webhook::new_secret();
    let until = now + chrono::Duration::hours(ROTATION_OVERLAP_H);
    if !store.rotate_webhook(id, &secret, until).await? {
        return Err(Error::not_found(format!("no webhook {id}")));
    }
    webhook.previous_secret = Some(std::mem::replace(&mut webhook.secret, secret.clone()));
    webhook.previous_until = Some(until);
    Ok(WithSecret { webhook, secret })
}

/// The newest deliveries of webhook `id` of `tenant` (removed or not), with every attempt.
pub async fn deliveries(
    store: &dyn WebhookStore,
    tenant: Option<&str>,
    id: &str,
) -> Result<Vec<DeliveryLog>, Error> {
    match store.webhook(id).await? {
        Some(w) if w.tenant.as_deref() == tenant => {}
        _ => return Err(Error::not_found(format!("no webhook {id}"))),
    }
    Ok(store.deliveries(id, DELIVERIES_LISTED_MAX).await?)
}

/// The wait after the `done`-th failed attempt: the first backoff doubled each time, at
/// most [`BACKOFF_MAX`].
pub fn backoff(first: Duration, done: u32) -> Duration {
    let doublings = done.saturating_sub(1).min(30);
    first.saturating_mul(1u32 << doublings).min(BACKOFF_MAX)
}

/// What follows attempt number `attempt` of `delivery`, which came to `sent`, at `now`.
pub fn after(
    settings: &Settings,
    delivery: &Delivery,
    attempt: u32,
    sent: &Sent,
    now: DateTime<Utc>,
) -> AfterAttempt {
    if let Sent::Answered(status) = sent
        && (200..300).contains(status)
    {
        return AfterAttempt::Delivered;
    }
    let wait = chrono::Duration::from_std(backoff(settings.first_backoff, attempt))
        .unwrap_or(chrono::Duration::hours(1));
    let next = now + wait;
    if next > delivery.created_at + chrono::Duration::hours(GIVE_UP_AFTER_H) {
        return AfterAttempt::GiveUp(format!(
            "given up after {attempt} attempts over {GIVE_UP_AFTER_H} hours; the last: {}",
            describe(sent)
        ));
    }
    AfterAttempt::RetryAt(next)
}

fn describe(sent: &Sent) -> String {
    match sent {
        Sent::Answered(status) => format!("the receiver answered {status}"),
        Sent::Failed(why) => why.clone(),
    }
}

/// The secrets that sign a delivery of `webhook` at `now`: its own, and the one a rotation
/// replaced while that still signs.
fn signing(webhook: &WebhookRecord, now: DateTime<Utc>) -> Vec<&str> {
    let mut secrets = vec![webhook.secret.as_str()];
    if let (Some(old), Some(until)) = (&webhook.previous_secret, webhook.previous_until)
        && until > now
    {
        secrets.push(old);
    }
    secrets
}

/// Sends one claimed delivery and records the attempt; whether it was delivered.
async fn send_one(
    store: &dyn WebhookStore,
    client: &webhook::Client,
    settings: &Settings,
    owner: &str,
    claimed: Claimed,
) -> Result<bool, Error> {
    let Claimed { delivery, webhook } = claimed;
    let started = std::time::Instant::now();
    let at = Utc::now();
    let sent = webhook::send(
        client,
        &settings.egress,
        &webhook.url,
        &delivery.id,
        at.timestamp(),
        &delivery.body,
        &signing(&webhook, at),
    )
    .await;
    let number = delivery.attempts + 1;
    let attempt = Attempt {
        delivery_id: delivery.id.clone(),
        attempt: number,
        at,
        status: match &sent {
            Sent::Answered(s) => Some(*s),
            Sent::Failed(_) => None,
        },
        error: match &sent {
            Sent::Answered(s) if (200..300).contains(s) => None,
            other => Some(describe(other)),
        },
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    let after = after(settings, &delivery, number, &sent, Utc::now());
    let delivered = after == AfterAttempt::Delivered;
    store.record_attempt(owner, &attempt, &after).await?;
    Ok(delivered)
}

/// Claims the deliveries due now and sends them, at most [`CLAIM_MAX`] at once; how many
/// were delivered.
pub async fn send_due(
    store: &Arc<dyn WebhookStore>,
    client: &webhook::Client,
    settings: &Settings,
    owner: &str,
) -> Result<usize, Error> {
    let now = Utc::now();
    let until = now + chrono::Duration::from_std(LEASE).unwrap_or(chrono::Duration::minutes(2));
    let claimed = store.claim_deliveries(owner, now, until, CLAIM_MAX).await?;
    // Sent together: one slow receiver does not hold the others back.
    let mut sends = tokio::task::JoinSet::new();
    for c in claimed {
        let (store, client, settings, owner) =
            (Arc::clone(store), client.clone(), settings.clone(), owner.to_owned());
        sends.spawn(async move { send_one(store.as_ref(), &client, &settings, &owner, c).await });
    }
    let mut delivered = 0;
    let mut failed = None;
    while let Some(joined) = sends.join_next().await {
        match joined {
            Ok(Ok(true)) => delivered += 1,
            Ok(Ok(false)) => {}
            Ok(Err(e)) => failed = Some(e),
            Err(e) => failed = Some(Error::internal(format!("a webhook send stopped: {e}"))),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(delivered),
    }
}

/// Sends webhooks until `stop`: looks for due deliveries every [`LOOK_EVERY`]; a failing
/// store is reported (on stderr, once per kind of failure in a row) and tried again.
#[allow(clippy::print_stderr)]
pub async fn run_sender(
    store: Arc<dyn WebhookStore>,
    settings: Settings,
    owner: String,
    stop: CancelToken,
) {
    let client = match webhook::client(&settings.egress, settings.timeout) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("{owner}: webhooks are not sent: {why}");
            return;
        }
    };
    let mut last_error: Option<String> = None;
    loop {
        match send_due(&store, &client, &settings, &owner).await {
            Ok(_) => last_error = None,
            Err(e) => {
                let said = e.to_string();
                if last_error.as_deref() != Some(said.as_str()) {
                    eprintln!("{owner}: sending webhooks: {said}");
                }
                last_error = Some(said);
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_store::webhooks::DeliveryState;

    fn delivery(created_at: DateTime<Utc>) -> Delivery {
        Delivery {
            id: "msg_1".to_owned(),
            webhook_id: "wh_1".to_owned(),
            run_id: "r".to_owned(),
            seq: 4,
            kind: "run.completed".to_owned(),
            body: "{}".to_owned(),
            created_at,
            next_at: created_at,
            attempts: 0,
            state: DeliveryState::Pending,
            last_error: None,
        }
    }

    #[test]
    fn waits_double_from_the_first_backoff_up_to_an_hour() {
        let first = Duration::from_secs(10);
        let waits: Vec<u64> = (1..=11).map(|n| backoff(first, n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]);
        assert_eq!(backoff(first, u32::MAX), BACKOFF_MAX, "no overflow");
    }

    #[test]
    fn a_2xx_delivers_anything_else_retries_until_a_day_after_the_event() {
        let settings = Settings::default();
        let start = Utc::now();
        let d = delivery(start);
        assert_eq!(after(&settings, &d, 1, &Sent::Answered(204), start), AfterAttempt::Delivered);
        assert_eq!(
            after(&settings, &d, 1, &Sent::Answered(500), start),
            AfterAttempt::RetryAt(start + chrono::Duration::seconds(10))
        );
        assert_eq!(
            after(&settings, &d, 3, &Sent::Failed("refused".to_owned()), start),
            AfterAttempt::RetryAt(start + chrono::Duration::seconds(40))
        );
        let late = start + chrono::Duration::hours(23) + chrono::Duration::minutes(30);
        match after(&settings, &d, 30, &Sent::Answered(503), late) {
            AfterAttempt::GiveUp(why) => {
                assert!(why.contains("30 attempts over 24 hours") && why.contains("503"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rotated_secret_signs_beside_the_new_one_until_its_time() {
        let now = Utc::now();
        let mut w = WebhookRecord {
            id: "wh_1".to_owned(),
            tenant: None,
            url: "https://example.com/".to_owned(),
            types: vec!["run.completed".to_owned()],
            secret: "whsec_new".to_owned(),
            previous_secret: Some("whsec_old".to_owned()),
            previous_until: Some(now + chrono::Duration::hours(1)),
            created_at: now,
            removed_at: None,
        };
        assert_eq!(signing(&w, now), ["whsec_new", "whsec_old"]);
        w.previous_until = Some(now - chrono::Duration::seconds(1));
        assert_eq!(signing(&w, now), ["whsec_new"]);
    }
}
