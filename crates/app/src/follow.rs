//! Following a tree of runs as it is written: the events of a run and of the runs it
//! starts, each child's right after the event that started it, read from the store while
//! another task (or process) drives the tree. The surface emits them as it shows events.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use baton_engine::Status;
use baton_engine::event::{Event, EventData};
use baton_engine::store::EventStore;
use tokio::sync::oneshot;

/// How often a follower looks for new events.
const FOLLOW_POLL: Duration = Duration::from_millis(50);

/// A run whose events a follower emits, from `after` on.
#[derive(Debug)]
pub struct Followed {
    run_id: String,
    after: u64,
    depth: usize,
    /// Its end has been emitted.
    done: bool,
}

impl Followed {
    pub fn new(run_id: &str, after: u64, depth: usize) -> Self {
        Followed { run_id: run_id.to_owned(), after, depth, done: false }
    }
}

/// The runs of a tree resumed from `root` to follow: each from its end, but `run_id` from
/// its last event — the decision or answer that led here is shown, then what follows.
pub async fn resumed(
    store: &dyn EventStore,
    root: &str,
    run_id: &str,
) -> Result<Vec<Followed>, baton_engine::exec::Error> {
    let mut follow = Vec::new();
    for (id, depth) in crate::runs::tree_of(store, root, true).await? {
        let last = store.run(&id).await?.map_or(0, |r| r.last_seq);
        let after = if id == run_id { last.saturating_sub(1) } else { last };
        follow.push(Followed::new(&id, after, depth));
    }
    Ok(follow)
}

/// Emits the events of a run and of the runs it starts, after each one's `after`, as
/// they arrive, until the first run ends or — with `stop` — until told to stop; then it
/// reads the logs once more, so every event written before the stop is emitted, once and
/// in order. A child's events come right after the event that started it, and all of them
/// before its parent's `child_run_settled`. It stops early, quietly, once `emit` says to
/// (a surface whose reader has gone: nothing it emits could be read).
pub async fn follow(
    store: &dyn EventStore,
    mut runs: Vec<Followed>,
    nested: bool,
    mut stop: Option<oneshot::Receiver<()>>,
    mut emit: impl FnMut(&str, usize, &Event) -> std::io::Result<ControlFlow<()>>,
) -> anyhow::Result<()> {
    let mut stopping = false;
    loop {
        // Whether a parent's log stopped at a child's settlement that must come first.
        let mut held_back = false;
        let mut emitted = 0;
        let mut i = 0;
        while i < runs.len() {
            if runs[i].done {
                i += 1;
                continue;
            }
            let events = match store.load(&runs[i].run_id, runs[i].after).await {
                Ok(events) => events,
                // A new run is written with its first level's results: wait for it (and a
                // run that failed before it was written has nothing to show).
                Err(baton_engine::store::Error::NotFound(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            // A run followed from its end (it had ended before) has no end left to emit —
            // once the record says it ended with nothing past what was read (it may have
            // ended between the read above and this look).
            if events.is_empty()
                && let Some(record) = store.run(&runs[i].run_id).await?
                && is_final(&record.status)
                && record.last_seq <= runs[i].after
            {
                runs[i].done = true;
            }
            emitted += events.len();
            for e in &events {
                if let EventData::ChildRunSettled(c) = &e.data
                    && runs.iter().any(|r| r.run_id == c.child_run_id && !r.done)
                {
                    held_back = true;
                    break;
                }
                if emit(&runs[i].run_id, runs[i].depth, e)?.is_break() {
                    return Ok(());
                }
                runs[i].after = e.seq;
                if let EventData::ChildRunStarted(c) = &e.data
                    && nested
                    && !runs.iter().any(|r| r.run_id == c.child_run_id)
                {
                    let depth = runs[i].depth + 1;
                    runs.push(Followed::new(&c.child_run_id, 0, depth));
                }
                if matches!(e.data, EventData::ScenarioFinished(_)) {
                    runs[i].done = true;
                }
            }
            i += 1;
        }
        if runs.first().is_none_or(|r| r.done) {
            return Ok(());
        }
        if held_back && emitted > 0 {
            continue;
        }
        if stopping {
            if !held_back {
                return Ok(());
            }
            tokio::time::sleep(FOLLOW_POLL).await;
            continue;
        }
        match stop.as_mut() {
            // A sent stop and a dropped sender both mean: read to the end, then stop.
            Some(rx) => tokio::select! {
                _ = rx => stopping = true,
                () = tokio::time::sleep(FOLLOW_POLL) => {}
            },
            None => tokio::time::sleep(FOLLOW_POLL).await,
        }
    }
}

/// Whether a listed status is a run's end.
pub fn is_final(status: &str) -> bool {
    [Status::Completed, Status::Aborted, Status::Cancelled, Status::Failed]
        .iter()
        .any(|s| s.as_str() == status)
}

/// A task emitting a tree's events while another drives it.
#[derive(Debug)]
pub struct Follower {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Follower {
    pub fn spawn(
        store: Arc<dyn EventStore>,
        runs: Vec<Followed>,
        emit: impl FnMut(&str, usize, &Event) -> std::io::Result<ControlFlow<()>> + Send + 'static,
    ) -> Follower {
        let (stop, stopped) = oneshot::channel();
        let task =
            tokio::spawn(
                async move { follow(store.as_ref(), runs, true, Some(stopped), emit).await },
            );
        Follower { stop, task }
    }

    /// Stops the follower once it has emitted every event in the store, and waits for it.
    pub async fn finish(self) -> anyhow::Result<()> {
        // The task may have ended already (at the end of the run): nobody to tell then.
        let _ = self.stop.send(());
        self.task.await.map_err(|e| anyhow::anyhow!("the event printer stopped: {e}"))?
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use baton_engine::event::{NewEvent, Warning};
    use baton_engine::store::{MemoryStore, RunRecord};
    use chrono::Utc;

    use super::*;

    fn warning(seq: u64) -> Event {
        NewEvent::run(EventData::Warning(Warning { message: format!("w{seq}") }))
            .at(seq, Utc::now())
    }

    #[tokio::test]
    async fn the_printer_emits_every_event_written_before_it_is_stopped_once_and_in_order() {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::default());
        let now = Utc::now();
        let record = RunRecord::new("r", "s", "running", now);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        // Started before the run exists, as `baton run` does.
        let printer =
            Follower::spawn(Arc::clone(&store), vec![Followed::new("r", 0, 0)], move |_, _, e| {
                sink.lock().unwrap().push(e.seq);
                Ok(ControlFlow::Continue(()))
            });
        store.create_run(&record, vec![warning(1)]).await.unwrap();
        while seen.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Written while the printer sleeps between polls, then stopped at once.
        store.append("r", 2, vec![warning(2), warning(3)], "running").await.unwrap();
        store.append("r", 4, vec![warning(4)], "paused").await.unwrap();
        printer.finish().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_printer_stopped_before_its_run_was_written_emits_nothing() {
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::default());
        let runs = vec![Followed::new("never", 0, 0)];
        let printer = Follower::spawn(store, runs, |_, _, _| panic!("nothing to print"));
        printer.finish().await.unwrap();
    }
}
