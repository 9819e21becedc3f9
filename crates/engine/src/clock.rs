//! Time, as the kernel sees it: only through this trait, so tests can fix it.

use chrono::{DateTime, Utc};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Milliseconds since `since`, for durations reported in events.
pub fn elapsed_ms(since: std::time::Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Waits that start short and double up to a cap: a loop that looks again and again at
/// what another process changes (a run it ends, children it settles) looks quickly at
/// first and seldom later, and never waits past its deadline.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    next: std::time::Duration,
    max: std::time::Duration,
}

impl Backoff {
    /// The waits of the settle loops: 10 ms, doubling, at most 400 ms.
    pub const SETTLE: Backoff = Backoff {
        next: std::time::Duration::from_millis(10),
        max: std::time::Duration::from_millis(400),
    };

    pub fn new(first: std::time::Duration, max: std::time::Duration) -> Self {
        Backoff { next: first.min(max), max }
    }

    /// The wait before the next look, cut at `deadline`; the one after is twice as long.
    pub fn next(&mut self, deadline: tokio::time::Instant) -> std::time::Duration {
        let wait = self.next.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        self.next = self.next.saturating_mul(2).min(self.max);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn waits_double_to_their_cap_and_stop_at_the_deadline() {
        let far = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut b = Backoff::SETTLE;
        let waits: Vec<u128> = (0..8).map(|_| b.next(far).as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 400, 400]);
        let near = tokio::time::Instant::now() + Duration::from_millis(5);
        assert!(
            Backoff::new(Duration::from_secs(1), Duration::from_secs(2)).next(near)
                <= Duration::from_millis(5)
        );
    }
}
