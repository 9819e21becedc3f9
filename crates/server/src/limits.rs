//! The server's limits beside the body size and the connections' (see `connections`): rates
//! — run starts per tenant, failed authentications per peer — as token buckets refilled
//! continuously, and long-lived streams (event streams and MCP sessions) open at once, per
//! token and on the whole server. Every refusal is a 429 that says when to come back. A
//! stream's place can be ended from outside: revoking its token or signing out of its
//! session ends it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::problem::Problem;

/// Keys a rate remembers at once; past it, the keys whose buckets are full again go (they
/// are as good as new), and if that is not enough, all do.
const RATE_KEYS_MAX: usize = 100_000;

/// A rate per key: a bucket of `per_minute` takes, refilled at that rate.
#[derive(Debug)]
pub(crate) struct Rate {
    per_minute: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Rate {
    pub(crate) fn new(per_minute: u32) -> Self {
        Rate { per_minute: f64::from(per_minute.max(1)), buckets: Mutex::default() }
    }

    pub(crate) fn per_minute(&self) -> f64 {
        self.per_minute
    }

    /// Takes one from `key`'s bucket, or says in how many seconds there is one.
    pub(crate) fn take(&self, key: &str) -> Result<(), u64> {
        self.look(key, true)
    }

    /// Whether `key`'s bucket has one left (taking nothing), or in how many seconds it will.
    pub(crate) fn left(&self, key: &str) -> Result<(), u64> {
        self.look(key, false)
    }

    fn look(&self, key: &str, take: bool) -> Result<(), u64> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if buckets.len() >= RATE_KEYS_MAX && !buckets.contains_key(key) {
            let full = self.per_minute;
            buckets.retain(|_, (left, at)| *left + at.elapsed().as_secs_f64() * full / 60.0 < full);
            if buckets.len() >= RATE_KEYS_MAX {
                buckets.clear();
            }
        }
        let (left, at) = buckets.entry(key.to_owned()).or_insert((self.per_minute, now));
        let refilled =
            (*left + at.elapsed().as_secs_f64() * self.per_minute / 60.0).min(self.per_minute);
        *at = now;
        if refilled >= 1.0 {
            *left = if take { refilled - 1.0 } else { refilled };
            return Ok(());
        }
        *left = refilled;
        Err(((1.0 - refilled) * 60.0 / self.per_minute).ceil().max(1.0) as u64)
    }
}

/// Streams open, per token and in all.
#[derive(Debug)]
pub(crate) struct Streams {
    per_token: usize,
    max: usize,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    next: u64,
    total: usize,
    /// By token id: each place's number, session (if opened through one) and end.
    by_token: HashMap<String, Vec<(u64, Option<String>, CancellationToken)>>,
}

/// One open stream; dropping it frees its place.
#[derive(Debug)]
pub(crate) struct StreamPlace {
    token: String,
    number: u64,
    ended: CancellationToken,
    open: Arc<Mutex<Open>>,
}

impl StreamPlace {
    /// Cancelled when the stream must end: its token was revoked or its session closed.
    pub(crate) fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(places) = open.by_token.get_mut(&self.token) else { return };
        let before = places.len();
        places.retain(|(n, _, _)| *n != self.number);
        let gone = before - places.len();
        if places.is_empty() {
            open.by_token.remove(&self.token);
        }
        open.total -= gone;
    }
}

impl Streams {
    pub(crate) fn new(per_token: usize, max: usize) -> Self {
        Streams { per_token, max, open: Arc::default() }
    }

    /// A place for a stream of `token` (opened through `session`, if any), or 429.
    pub(crate) fn open(&self, token: &str, session: Option<&str>) -> Result<StreamPlace, Problem> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.total >= self.max {
            return Err(Problem::too_many(
                format!(
                    "this server has {} event streams and MCP sessions open, the most it holds; try again shortly",
                    self.max
                ),
                5,
            ));
        }
        let mine = open.by_token.get(token).map_or(0, Vec::len);
        if mine >= self.per_token {
            return Err(Problem::too_many(
                format!(
                    "token {token} has {} event streams and MCP sessions open, the most it may; close one first",
                    self.per_token
                ),
                1,
            ));
        }
        open.next += 1;
        open.total += 1;
        let number = open.next;
        let ended = CancellationToken::new();
        open.by_token.entry(token.to_owned()).or_default().push((
            number,
            session.map(str::to_owned),
            ended.clone(),
        ));
        Ok(StreamPlace { token: token.to_owned(), number, ended, open: Arc::clone(&self.open) })
    }

    /// The tokens with streams open.
    pub(crate) fn tokens(&self) -> Vec<String> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.by_token.keys().cloned().collect()
    }

    /// The browser sessions with streams open, each with its token.
    pub(crate) fn sessions(&self) -> Vec<(String, String)> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pairs: Vec<(String, String)> = open
            .by_token
            .iter()
            .flat_map(|(t, places)| {
                places.iter().filter_map(|(_, s, _)| s.clone().map(|s| (t.clone(), s)))
            })
            .collect();
        pairs.sort();
        pairs.dedup();
        pairs
    }

    /// Ends every stream of `token`, or only those opened through `session`.
    pub(crate) fn end(&self, token: &str, session: Option<&str>) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, s, ended) in open.by_token.get(token).into_iter().flatten() {
            if session.is_none() || s.as_deref() == session {
                ended.cancel();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refuses_past_its_rate_per_key() {
        let rate = Rate::new(3);
        for _ in 0..3 {
            assert!(rate.left("a").is_ok());
            assert!(rate.take("a").is_ok());
        }
        let wait = rate.take("a").expect_err("the fourth in a minute");
        assert!(wait >= 1);
        assert!(rate.left("a").is_err());
        assert!(rate.take("b").is_ok(), "another key has its own bucket");
    }

    #[test]
    fn a_stream_place_is_freed_when_dropped_and_the_server_has_a_cap_of_its_own() {
        let streams = Streams::new(2, 3);
        let a = streams.open("t", None).expect("first");
        let _b = streams.open("t", None).expect("second");
        assert_eq!(streams.open("t", None).expect_err("third of a token").status, 429);
        drop(a);
        let _again = streams.open("t", None).expect("a freed place");
        let _c = streams.open("u", None).expect("another token");
        let refused = streams.open("v", None).expect_err("past the server's cap");
        assert_eq!(refused.status, 429);
        assert!(refused.detail.contains("this server has 3"), "{}", refused.detail);
    }

    #[test]
    fn ending_a_token_or_a_session_ends_exactly_its_streams() {
        let streams = Streams::new(8, 8);
        let by_token = streams.open("t", None).expect("a place");
        let in_session = streams.open("t", Some("s1")).expect("a place");
        let other_session = streams.open("t", Some("s2")).expect("a place");
        let other_token = streams.open("u", None).expect("a place");
        streams.end("t", Some("s1"));
        assert!(in_session.ended().is_cancelled());
        assert!(!by_token.ended().is_cancelled() && !other_session.ended().is_cancelled());
        streams.end("t", None);
        assert!(by_token.ended().is_cancelled() && other_session.ended().is_cancelled());
        assert!(!other_token.ended().is_cancelled());
        assert_eq!(streams.tokens().len(), 2);
    }
}
