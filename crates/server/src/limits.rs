//! The server's limits beside the body size (which axum enforces): run starts per tenant per
//! minute (a token bucket refilled continuously) and event streams open at once per token.
//! Both refuse with 429 and say when to come back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::problem::Problem;

/// Run starts per tenant: a bucket of `per_minute` starts, refilled at that rate.
#[derive(Debug)]
pub(crate) struct StartRate {
    per_minute: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl StartRate {
    pub(crate) fn new(per_minute: u32) -> Self {
        StartRate { per_minute: f64::from(per_minute.max(1)), buckets: Mutex::default() }
    }

    /// Takes one start for `tenant`, or says how long until there is one.
    pub(crate) fn take(&self, tenant: &str) -> Result<(), Problem> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (left, at) = buckets.entry(tenant.to_owned()).or_insert((self.per_minute, now));
        let refilled =
            (*left + at.elapsed().as_secs_f64() * self.per_minute / 60.0).min(self.per_minute);
        *at = now;
        if refilled >= 1.0 {
            *left = refilled - 1.0;
            return Ok(());
        }
        *left = refilled;
        let wait = ((1.0 - refilled) * 60.0 / self.per_minute).ceil().max(1.0);
        Err(Problem::too_many(
            format!(
                "tenant {tenant} may start {} runs a minute and has started them; try again in {wait} s",
                self.per_minute
            ),
            wait as u64,
        ))
    }
}

/// Event streams open per token.
#[derive(Debug)]
pub(crate) struct Streams {
    per_token: usize,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open stream; closing it (dropping this) frees its place.
#[derive(Debug)]
pub(crate) struct StreamPlace {
    token: String,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.token);
            }
        }
    }
}

impl Streams {
    pub(crate) fn new(per_token: usize) -> Self {
        Streams { per_token, open: Arc::default() }
    }

    pub(crate) fn open(&self, token: &str) -> Result<StreamPlace, Problem> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(token.to_owned()).or_insert(0);
        if *n >= self.per_token {
            return Err(Problem::too_many(
                format!(
                    "token {token} has {} event streams open, the most it may; close one first",
                    self.per_token
                ),
                1,
            ));
        }
        *n += 1;
        Ok(StreamPlace { token: token.to_owned(), open: Arc::clone(&self.open) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refuses_past_its_rate_per_tenant() {
        let rate = StartRate::new(3);
        for _ in 0..3 {
            assert!(rate.take("a").is_ok());
        }
        let refused = rate.take("a").expect_err("the fourth start in a minute");
        assert_eq!(refused.status, 429);
        assert!(refused.retry_after_s.is_some_and(|s| s >= 1));
        assert!(rate.take("b").is_ok(), "another tenant has its own bucket");
    }

    #[test]
    fn a_stream_place_is_freed_when_dropped() {
        let streams = Streams::new(2);
        let a = streams.open("t").expect("first");
        let _b = streams.open("t").expect("second");
        assert_eq!(streams.open("t").expect_err("third").status, 429);
        drop(a);
        assert!(streams.open("t").is_ok());
    }
}
