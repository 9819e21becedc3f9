//! A damaged log is never driven or appended to, and no retry loop of the executor runs
//! forever.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use baton_engine::event::{Event, EventData, Warning};
use baton_engine::exec::{CONFLICTS_IN_A_ROW_MAX, EXTERNAL_APPEND_TRIES_MAX, Error};
use baton_engine::model::{BoxFuture, ScriptedModel};
use baton_engine::store::{self, EventStore, MemoryStore, RunRecord};
use baton_engine::{Outcome, Status};
use chrono::{DateTime, Utc};
use serde_json::Map;

use crate::{engine_on, scenario};

const APPROVAL: &str = "
id: appr
version: 1
levels:
  - {id: draft, kind: prompt, prompt: {inline: 'Draft'}}
  - {id: approve, kind: human_approval, approver_role: lead, prompt: {inline: 'Ship it?'}}
  - {id: final, kind: prompt, prompt: {inline: 'Final'}, terminal: true}
edges:
  - {from: draft, to: approve}
  - {from: approve, to: final, when: level.approve.approved}
  - {from: approve, to: draft}
";

/// The stored events of a run, read past every check.
fn raw(store: &MemoryStore, run_id: &str) -> Vec<Event> {
    let mut out = Vec::new();
    store.damage(run_id, |events, _| out = events.iter().map(|(e, _)| e.clone()).collect());
    out
}

fn is_damaged(e: &Error, run_id: &str, seq: u64) -> bool {
    matches!(e, Error::Store(store::Error::Damaged { run_id: r, seq: s, .. }) if r == run_id && *s == seq)
}

#[tokio::test]
async fn a_damaged_log_is_neither_decided_on_nor_driven() {
    let s = scenario(APPROVAL);
    let memory = MemoryStore::new();
    let e = engine_on(Arc::new(memory.clone()), ScriptedModel::constant("text"));
    let run = e.start(&s, "x", Map::new()).await.unwrap();
    assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
    let intact = raw(&memory, &run);
    // The draft's answer is edited in place.
    memory.damage(&run, |events, _| {
        let (event, _) =
            events.iter_mut().find(|(e, _)| matches!(e.data, EventData::ModelResponse(_))).unwrap();
        event.data = EventData::Warning(Warning { message: "edited".to_owned() });
    });
    let bad = intact.iter().find(|e| matches!(e.data, EventData::ModelResponse(_))).unwrap().seq;

    let approve = e.approve(&run, true, None, Some("ann".into())).await.unwrap_err();
    assert!(is_damaged(&approve, &run, bad), "{approve}");
    assert!(approve.to_string().contains(&format!("run {run} is damaged at event {bad}")));
    let answer = e.answer(&run, serde_json::json!("yes")).await.unwrap_err();
    assert!(is_damaged(&answer, &run, bad), "{answer}");
    let cancel = e.cancel(&run, None, None).await.unwrap_err();
    assert!(is_damaged(&cancel, &run, bad), "{cancel}");
    let drive = e.drive(&run, &s).await.unwrap_err();
    assert!(is_damaged(&drive, &run, bad), "{drive}");
    assert_eq!(raw(&memory, &run).len(), intact.len(), "nothing was appended");
}

/// Runs `test` on a thread of its own with its own runtime and fails if it does not end
/// within `secs`: a driver that spins never yields, so no timer inside its runtime fires.
fn within<F: std::future::Future<Output = ()> + 'static>(
    secs: u64,
    test: impl FnOnce() -> F + Send + 'static,
) {
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(test());
        let _ = done.send(());
    });
    ended
        .recv_timeout(Duration::from_secs(secs))
        .expect("the test ends: no driver loop may spin (a panic above says what failed)");
}

#[test]
fn a_run_whose_record_is_ahead_of_its_log_is_refused_not_spun_on() {
    within(20, || async {
        let s = scenario(APPROVAL);
        let memory = MemoryStore::new();
        let e = engine_on(Arc::new(memory.clone()), ScriptedModel::constant("text"));
        let run = e.start(&s, "x", Map::new()).await.unwrap();
        assert_eq!(e.drive(&run, &s).await.unwrap(), Outcome::Paused);
        e.approve(&run, true, None, None).await.unwrap();
        let last = raw(&memory, &run).len() as u64;
        memory.damage(&run, |_, record| record.last_seq = last + 2);
        let drive = e.drive(&run, &s).await.unwrap_err();
        assert!(is_damaged(&drive, &run, last + 1), "{drive}");
        assert_eq!(raw(&memory, &run).len() as u64, last, "nothing was appended");
    });
}

/// A store whose appends always lose to "another writer": a log that moves every time.
#[derive(Debug, Default)]
struct Conflicting {
    inner: MemoryStore,
    appends: AtomicU32,
}

impl EventStore for Conflicting {
    fn create_run<'a>(
        &'a self,
        run: &'a RunRecord,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        self.inner.create_run(run, events)
    }
    fn append<'a>(
        &'a self,
        run_id: &'a str,
        expected: u64,
        _events: Vec<Event>,
        _status: &'a str,
    ) -> BoxFuture<'a, Result<(), store::Error>> {
        self.appends.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Err(store::Error::Conflict {
                run_id: run_id.to_owned(),
                expected,
                actual: expected + 1,
            })
        })
    }
    delegate_all_to_inner!();
}

#[test]
fn a_log_that_always_moves_is_given_up_on_with_a_reason() {
    within(20, || async {
        let s = scenario(APPROVAL);
        let store = Arc::new(Conflicting::default());
        let e =
            engine_on(Arc::clone(&store) as Arc<dyn EventStore>, ScriptedModel::constant("text"));
        let run = e.start(&s, "x", Map::new()).await.unwrap();
        let drive = e.drive(&run, &s).await.unwrap_err();
        let message = drive.to_string();
        assert!(
            message.contains(&format!("gave up driving after {CONFLICTS_IN_A_ROW_MAX} appends")),
            "{message}"
        );
        assert!(message.contains(&format!("baton verify {run}")), "{message}");
        assert_eq!(store.appends.swap(0, Ordering::SeqCst), CONFLICTS_IN_A_ROW_MAX);

        let cancel = e.cancel(&run, None, None).await.unwrap_err().to_string();
        assert!(
            cancel.contains(&format!(
                "gave up recording cancel_requested after {EXTERNAL_APPEND_TRIES_MAX} tries"
            )),
            "{cancel}"
        );
        assert_eq!(store.appends.load(Ordering::SeqCst), EXTERNAL_APPEND_TRIES_MAX);
        assert_eq!(e.state(&run).await.unwrap().status, Status::Running, "nothing was recorded");
    });
}
