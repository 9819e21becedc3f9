//! A test barrier, for both stores: with `BATON_TEST_DECISION_BARRIER=DIR` in the
//! environment, the first append of this process that holds an outside decision
//! (`approval_decided`, `user_answered`, `wave_recorded`, `wave_decided`) creates
//! `DIR/loaded.PID` and waits (at most [`WAIT_MAX`]) until `DIR/go` exists before it is
//! written. The decision was made on the log it read, so a test can show that racing
//! deciders all read the log before any of them wrote.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use baton_engine::event::Event;

/// Longest a decision waits at the barrier.
pub(crate) const WAIT_MAX: Duration = Duration::from_secs(60);

/// The kinds of event an outside decision appends.
const DECISIONS: [&str; 4] = ["approval_decided", "user_answered", "wave_recorded", "wave_decided"];

/// The barrier's directory while it has not fired in this process; `None` without the
/// variable, so that an append without a barrier takes no lock.
fn armed() -> Option<&'static Mutex<Option<PathBuf>>> {
    static ARMED: OnceLock<Option<Mutex<Option<PathBuf>>>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            std::env::var_os("BATON_TEST_DECISION_BARRIER").map(|d| Mutex::new(Some(d.into())))
        })
        .as_ref()
}

/// The barrier's directory when these events hold a decision and it has not fired yet
/// (it fires once per process); it is said to be reached (`loaded.PID`).
pub(crate) fn reached(events: &[Event]) -> Option<PathBuf> {
    let armed = armed()?;
    if !events.iter().any(|e| DECISIONS.contains(&e.data.kind())) {
        return None;
    }
    let dir = armed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()?;
    let _ = std::fs::write(dir.join(format!("loaded.{}", std::process::id())), b"");
    Some(dir)
}

/// Whether the test has opened the barrier, or it waited long enough.
fn open(dir: &Path, since: Instant) -> bool {
    dir.join("go").exists() || since.elapsed() >= WAIT_MAX
}

/// Waits at the barrier, blocking the thread (SQLite's writer).
pub(crate) fn wait_blocking(dir: &Path) {
    let since = Instant::now();
    while !open(dir, since) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits at the barrier.
pub(crate) async fn wait(dir: &Path) {
    let since = Instant::now();
    while !open(dir, since) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
