//! Cancellation inside one process: a flag runners poll and a signal they can await, and
//! the step's progress counters, which heartbeats report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;

use crate::event::{ModelCallCut, ProviderRetry};
use crate::workspace::WorkspaceError;

/// A cancel signal shared by the executor and the runners of one step, with the step's
/// progress: whatever runs the step (a provider streaming an answer, a tool loop) counts
/// its progress here, and the executor's heartbeats report it.
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    flag: Arc<AtomicBool>,
    notify: Arc<Notify>,
    progress: Arc<Progress>,
    /// The token this one was made from: its cancel cancels this one too.
    parent: Option<Box<CancelToken>>,
}

/// How far a step has come.
#[derive(Debug, Default)]
pub struct Progress {
    streamed_bytes: AtomicU64,
    tool_calls: AtomicU64,
    /// HTTP-level retries the model client made, not yet recorded (bounded by the client's
    /// attempts; drained after each call).
    retries: PerCall<ProviderRetry>,
    /// Model calls cut short and what they spent, not yet recorded (one per call at most).
    cuts: PerCall<ModelCallCut>,
    /// Why the step stopped for a reason that says nothing about the run (a transient
    /// workspace failure): the driver keeps none of the step's work and stops.
    interruption: std::sync::Mutex<Option<WorkspaceError>>,
    /// Where the text of model answers goes as it streams in (the run it belongs to, and
    /// the embedder's sink), when the engine was given one.
    live: std::sync::OnceLock<(Arc<str>, LiveSink)>,
}

pub use crate::event::LiveText;

/// Where [`LiveText`] goes: called on the task that reads the answer, so it must not block.
#[derive(Clone)]
pub struct LiveSink(pub Arc<dyn Fn(LiveText) + Send + Sync>);

impl std::fmt::Debug for LiveSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveSink")
    }
}

/// Reports of the model client about one call (of a level, by call index), kept until the
/// engine takes them after that call.
#[derive(Debug)]
struct PerCall<T>(std::sync::Mutex<Vec<(String, u32, T)>>);

impl<T> Default for PerCall<T> {
    fn default() -> Self {
        PerCall(std::sync::Mutex::new(Vec::new()))
    }
}

impl<T> PerCall<T> {
    fn push(&self, level_id: &str, call_index: u32, report: T) {
        if let Ok(mut reports) = self.0.lock() {
            reports.push((level_id.to_owned(), call_index, report));
        }
    }

    fn take(&self, level_id: &str, call_index: u32) -> Vec<T> {
        let Ok(mut reports) = self.0.lock() else { return Vec::new() };
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut *reports)
            .into_iter()
            .partition(|(l, c, _)| l == level_id && *c == call_index);
        *reports = others;
        mine.into_iter().map(|(_, _, r)| r).collect()
    }
}

impl Progress {
    /// Sends the text of model answers this step receives to `sink`, for `run_id` (once per
    /// step; later calls are ignored).
    pub fn stream_to(&self, run_id: Arc<str>, sink: LiveSink) {
        let _ = self.live.set((run_id, sink));
    }

    /// A piece of the answer to call `call` of level `level_id`, as it arrived.
    pub fn text(&self, level_id: &str, call: u32, text: &str) {
        if let Some((run_id, sink)) = self.live.get()
            && !text.is_empty()
        {
            (sink.0)(LiveText {
                run_id: Arc::clone(run_id),
                level_id: level_id.to_owned(),
                call,
                text: text.to_owned(),
            });
        }
    }

    /// Counts bytes of a model answer received.
    pub fn streamed(&self, bytes: usize) {
        self.streamed_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a tool call run.
    pub fn tool_call(&self) {
        self.tool_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Reports an HTTP-level retry of call `call_index` of level `level_id`, for the engine
    /// to record as a `provider_retry` event: no retry is hidden.
    pub fn retried(&self, level_id: &str, call_index: u32, retry: ProviderRetry) {
        self.retries.push(level_id, call_index, retry);
    }

    /// Takes the retries reported for call `call_index` of level `level_id`, oldest first.
    pub fn take_retries(&self, level_id: &str, call_index: u32) -> Vec<ProviderRetry> {
        self.retries.take(level_id, call_index)
    }

    /// Reports that call `call_index` of level `level_id` was cut short (a cancel, a
    /// deadline) and what it spent, for the engine to record as `model_call_cut`: what an
    /// interrupted call cost counts.
    pub fn cut(&self, level_id: &str, call_index: u32, cut: ModelCallCut) {
        self.cuts.push(level_id, call_index, cut);
    }

    /// Takes the cut reported for call `call_index` of level `level_id`.
    pub fn take_cuts(&self, level_id: &str, call_index: u32) -> Vec<ModelCallCut> {
        self.cuts.take(level_id, call_index)
    }

    /// Stops the step for a reason that says nothing about the run: the driver records
    /// none of it and returns the error, and the run stays resumable.
    pub fn interrupt(&self, error: WorkspaceError) {
        if let Ok(mut slot) = self.interruption.lock() {
            slot.get_or_insert(error);
        }
    }

    /// The reason the step was interrupted, if it was.
    pub fn take_interruption(&self) -> Option<WorkspaceError> {
        self.interruption.lock().ok().and_then(|mut slot| slot.take())
    }

    /// Bytes of model answers received so far.
    pub fn streamed_bytes(&self) -> u64 {
        self.streamed_bytes.load(Ordering::Relaxed)
    }

    /// Tool calls run so far.
    pub fn tool_calls(&self) -> u64 {
        self.tool_calls.load(Ordering::Relaxed)
    }
}

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels; every waiter wakes.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// A token cancelled with this one or on its own (a level's timeout cuts its attempt
    /// without cancelling the run), sharing this one's progress counters.
    pub fn child(&self) -> Self {
        CancelToken {
            flag: Arc::default(),
            notify: Arc::default(),
            progress: Arc::clone(&self.progress),
            parent: Some(Box::new(self.clone())),
        }
    }

    /// Whether it, or the token it was made from, was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst) || self.parent.as_ref().is_some_and(|p| p.is_cancelled())
    }

    /// The step's progress counters.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        match &self.parent {
            Some(parent) => {
                tokio::select! {
                    () = self.own_cancel() => {}
                    () = Box::pin(parent.cancelled()) => {}
                }
            }
            None => self.own_cancel().await,
        }
    }

    /// Resolves once this token itself is cancelled.
    async fn own_cancel(&self) {
        loop {
            let notified = self.notify.notified();
            if self.flag.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}
