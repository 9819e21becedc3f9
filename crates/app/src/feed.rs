//! The feed: every run's events — one tenant's, or every tenant's — in the order they were
//! committed, from a cursor, each read checked from its run's log. `baton events --all`
//! and `GET /events` read it here, page by page, and wait for more the same way.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use baton_engine::event::Event;
use baton_engine::store::{EventStore, FeedCursor, FeedRef};

use crate::error::Error;

/// Most events one page of the feed holds.
pub const PAGE_MAX: usize = 1000;

/// How often a follower of the feed asks the store for more.
pub const POLL: Duration = Duration::from_millis(250);

/// One event of the feed: where it stands, its run, the event.
#[derive(Clone, Debug)]
pub struct FeedEvent {
    pub cursor: FeedCursor,
    pub run_id: String,
    pub event: Event,
}

/// A page of the feed and where the next one starts (where it started, when it is empty).
#[derive(Clone, Debug)]
pub struct FeedPage {
    pub events: Vec<FeedEvent>,
    pub next: FeedCursor,
}

/// The events after `after` (at most `limit`, at most [`PAGE_MAX`]) of `tenant`'s runs
/// (`None`: every tenant's; `Some(None)`: runs of no tenant). Each run's events are read
/// with `load`, which checks them against the run's chain: a damaged log is an error, not
/// a page. An event of a run purged since it was listed is left out.
pub async fn page(
    store: &dyn EventStore,
    tenant: &Option<Option<String>>,
    after: FeedCursor,
    limit: usize,
) -> Result<FeedPage, Error> {
    let refs = store.feed(tenant, after, limit.clamp(1, PAGE_MAX)).await?;
    let next = refs.last().map_or(after, |r| r.cursor);
    // For each run the page names: the first and the last of its events named.
    let mut span: HashMap<&str, (u64, u64)> = HashMap::new();
    for r in &refs {
        let s = span.entry(r.run_id.as_str()).or_insert((r.seq, r.seq));
        s.0 = s.0.min(r.seq);
        s.1 = s.1.max(r.seq);
    }
    let mut read: HashMap<&str, BTreeMap<u64, Event>> = HashMap::new();
    for (run_id, (first, last)) in span {
        let events = match store.load(run_id, first.saturating_sub(1)).await {
            Ok(events) => events,
            Err(baton_engine::store::Error::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        let kept = events.into_iter().filter(|e| e.seq <= last).map(|e| (e.seq, e)).collect();
        read.insert(run_id, kept);
    }
    let events = refs
        .iter()
        .filter_map(|FeedRef { cursor, run_id, seq }| {
            let event = read.get_mut(run_id.as_str())?.remove(seq)?;
            Some(FeedEvent { cursor: *cursor, run_id: run_id.clone(), event })
        })
        .collect();
    Ok(FeedPage { events, next })
}

/// The next page after `after` that holds events, waiting for one at most `wait` (polling
/// every [`POLL`]); an empty page when none came in time.
pub async fn next_page(
    store: &dyn EventStore,
    tenant: &Option<Option<String>>,
    after: FeedCursor,
    limit: usize,
    wait: Duration,
) -> Result<FeedPage, Error> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut at = after;
    loop {
        let page = page(store, tenant, at, limit).await?;
        // A page whose events were all purged since still moves the cursor on.
        if !page.events.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(page);
        }
        at = page.next;
        tokio::time::sleep(POLL.min(deadline - tokio::time::Instant::now())).await;
    }
}
