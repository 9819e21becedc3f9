//! Running futures concurrently inside one task, at most `limit` at a time.
//!
//! Fan-out children and parallel verifiers wait mostly on the outside world; polling them
//! together in the step's own task avoids spawning a task per child and keeps their
//! results in declared order.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Runs every future, at most `limit` at once, and returns their outputs in input order.
pub async fn join_limited<F: Future>(futures: Vec<F>, limit: usize) -> Vec<F::Output> {
    let total = futures.len();
    let mut waiting = futures.into_iter().enumerate();
    let mut active: Vec<(usize, Pin<Box<F>>)> = Vec::with_capacity(limit.min(total));
    let mut outputs: Vec<Option<F::Output>> = (0..total).map(|_| None).collect();
    let mut done = 0;
    std::future::poll_fn(move |cx| {
        loop {
            while active.len() < limit.max(1) {
                match waiting.next() {
                    Some((i, f)) => active.push((i, Box::pin(f))),
                    None => break,
                }
            }
            let mut progressed = false;
            let mut k = 0;
            while k < active.len() {
                if let Poll::Ready(out) = active[k].1.as_mut().poll(cx) {
                    // `remove`, not `swap_remove`: the others keep being polled in declared
                    // order, so the first to ask for something (a budget reservation) is
                    // the first declared.
                    let (i, _) = active.remove(k);
                    outputs[i] = Some(out);
                    done += 1;
                    progressed = true;
                } else {
                    k += 1;
                }
            }
            if done == total {
                return Poll::Ready(std::mem::take(&mut outputs).into_iter().flatten().collect());
            }
            // A finished future freed a slot: start the next ones before waiting.
            if !progressed || waiting.len() == 0 {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// Futures polled together in one task, each taken out as it finishes, in the order they
/// finish; more can be added between takes (a sliding window).
pub struct Pool<F: Future> {
    active: Vec<Pin<Box<F>>>,
}

impl<F: Future> std::fmt::Debug for Pool<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("active", &self.active.len()).finish()
    }
}

impl<F: Future> Default for Pool<F> {
    fn default() -> Self {
        Pool { active: Vec::new() }
    }
}

impl<F: Future> Pool<F> {
    /// Adds a future; it is first polled by the next [`Pool::next`].
    pub fn push(&mut self, future: F) {
        self.active.push(Box::pin(future));
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// The output of the first future to finish; `None` when the pool is empty.
    pub async fn next(&mut self) -> Option<F::Output> {
        if self.active.is_empty() {
            return None;
        }
        std::future::poll_fn(|cx| {
            for k in 0..self.active.len() {
                if let Poll::Ready(out) = self.active[k].as_mut().poll(cx) {
                    self.active.remove(k);
                    return Poll::Ready(Some(out));
                }
            }
            Poll::Pending
        })
        .await
    }
}
