//! Cost reservations: what one step's model calls have spent and hold against the run's
//! cost cap, shared by every call of the step.
//!
//! A fan-out's children run at once and read the same state, so each one's check before a
//! call sees none of its siblings' spend. Each call therefore reserves its worst case in
//! the step's [`Reservations`] before it is made, and the reservation shrinks to the call's
//! actual cost when it returns (to nothing when it failed): the calls in flight together
//! never cross the cap. Not part of the kernel's fold: it lives only while a step runs.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The spend and the reservations of one step's model calls, beyond the run's totals.
#[derive(Clone, Debug, Default)]
pub struct Reservations {
    held_usd: Arc<Mutex<f64>>,
}

/// One call's reserved worst case; dropped without [`Reservation::settle`], it is released.
#[derive(Debug)]
pub struct Reservation {
    pool: Reservations,
    worst_usd: f64,
    settled: bool,
}

impl Reservations {
    fn held(&self) -> MutexGuard<'_, f64> {
        // The guarded value is a plain number, always whole: a panic elsewhere leaves it usable.
        self.held_usd.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the step has spent and reserved so far, in US dollars.
    pub fn held_usd(&self) -> f64 {
        *self.held()
    }

    /// Reserves `worst_usd` when the run's committed spend, what the step holds and
    /// `worst_usd` together stay within `max_usd`; otherwise returns the amount they would
    /// reach, and nothing is reserved.
    pub fn reserve(
        &self,
        committed_usd: f64,
        worst_usd: f64,
        max_usd: f64,
    ) -> Result<Reservation, f64> {
        let mut held = self.held();
        let reached = committed_usd + *held + worst_usd;
        if reached > max_usd {
            return Err(reached);
        }
        *held += worst_usd;
        Ok(Reservation { pool: self.clone(), worst_usd, settled: false })
    }
}

impl Reservation {
    /// The call returned having cost `actual_usd`: the reservation becomes that spend.
    pub fn settle(mut self, actual_usd: f64) {
        *self.pool.held() += actual_usd - self.worst_usd;
        self.settled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            *self.pool.held() -= self.worst_usd;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Reservations;

    #[test]
    fn reservations_of_calls_in_flight_never_cross_the_cap() {
        let pool = Reservations::default();
        let first = pool.reserve(0.0, 0.004, 0.01).expect("0.004 of 0.01 fits");
        let second = pool.reserve(0.0, 0.004, 0.01).expect("0.008 of 0.01 fits");
        let refused = pool.reserve(0.0, 0.004, 0.01).expect_err("0.012 crosses 0.01");
        assert!((refused - 0.012).abs() < 1e-12, "{refused}");
        // Settled below the worst case, the freed part can be reserved again.
        first.settle(0.001);
        second.settle(0.001);
        assert!((pool.held_usd() - 0.002).abs() < 1e-12);
        let third = pool.reserve(0.0, 0.004, 0.01).expect("0.006 of 0.01 fits");
        drop(third);
        assert!((pool.held_usd() - 0.002).abs() < 1e-12, "a dropped reservation is released");
    }

    #[test]
    fn the_run_spend_already_committed_counts() {
        let pool = Reservations::default();
        assert!(pool.reserve(0.008, 0.004, 0.01).is_err());
        assert!(pool.reserve(0.006, 0.004, 0.01).is_ok());
    }
}
