//! Watching a step while it runs: commits of what is staged when the step is slow, the
//! `prompt_sent` of each call that reaches out (committed before the call is made), a
//! fan-out's children as each settles, heartbeats, the run's time limit, the driver's stop
//! and cancel requests written by other processes.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{CANCEL_POLL, Error, FLUSH_AFTER, HEARTBEAT_EVERY, StepChannels, Writer};
use crate::cancel::CancelToken;
use crate::event::{EventData, NewEvent};
use crate::runner::{LevelRun, next_settled};

impl Writer<'_> {
    /// Runs a step; commits the staged events if it is slow, and watches the store for a
    /// cancel request while it runs.
    ///
    /// When `time_left` runs out, `over_time` is cancelled and the step awaited until it
    /// has stopped (its processes killed), so nothing it started outlives it.
    ///
    /// A fan-out's children that finish while it runs arrive on `settled`, one batch per
    /// child: each is staged and committed as it arrives (one transaction per child), so a
    /// crash or a cancel keeps them. Once the step has stopped, the batches still queued
    /// are staged ahead of its own events; after a cancel they are dropped with the step.
    ///
    /// A call that reaches out sends its `prompt_sent` (after the step's events so far) on
    /// `sent` and waits: it is committed, then the call is told to go on. When the step is
    /// being cut, it is dropped instead, and the call is not made.
    pub(crate) async fn run_watching(
        &mut self,
        run: LevelRun,
        cancel: &CancelToken,
        over_time: &CancelToken,
        time_left: Option<Duration>,
        channels: StepChannels<'_>,
    ) -> Result<Vec<NewEvent>, Error> {
        let StepChannels { mut settled, sent } = channels;
        let steering = run.steering.clone();
        // What a heartbeat names, kept before the attempt takes the run.
        let (level_id, attempt) = (run.id().to_owned(), run.attempt);
        let runner = std::sync::Arc::clone(&run.runtime.runner);
        let work = runner.run(run);
        tokio::pin!(work);
        // Most steps finish without waiting for anything: try once before arming timers.
        let ready = std::future::poll_fn(|cx| match work.as_mut().poll(cx) {
            std::task::Poll::Ready(events) => std::task::Poll::Ready(Some(events)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await;
        if let Some(events) = ready {
            self.stage_queued(settled.as_deref_mut(), cancel);
            return Ok(events);
        }
        let wake = self.engine.store.notifier(self.run_id).await;
        let flush_at = tokio::time::sleep(FLUSH_AFTER);
        tokio::pin!(flush_at);
        let mut flushed = false;
        // A store whose notice covers every process is read when it says so, and not
        // polled: the heartbeat, an append conditional on the log's end, is the safety net
        // for a notice lost with its connection (it fails on anything appended meanwhile).
        let polling = !(wake.is_some() && self.engine.store.notices_other_processes());
        let mut poll = tokio::time::interval(CANCEL_POLL);
        poll.tick().await;
        let started = tokio::time::Instant::now();
        let mut heartbeat = tokio::time::interval_at(started + HEARTBEAT_EVERY, HEARTBEAT_EVERY);
        let out_of_time = tokio::time::sleep(time_left.unwrap_or(Duration::MAX / 4));
        tokio::pin!(out_of_time);
        loop {
            tokio::select! {
                events = &mut work => {
                    self.stage_queued(settled.as_deref_mut(), cancel);
                    return Ok(events);
                }
                Some((batch, go_on)) = sent.recv() => {
                    if cancel.is_cancelled() {
                        // The step is being cut: the call is not made.
                        continue;
                    }
                    self.stage(batch);
                    if self.flush().await? {
                        let _ = go_on.send(());
                    } else {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                batch = next_settled(settled.as_deref_mut()), if !cancel.is_cancelled() => {
                    self.stage(batch);
                    if !self.flush().await? {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                () = self.engine.stop.cancelled(), if !cancel.is_cancelled() => {
                    // The driver is stopping: cut the step; the drive records the stop.
                    cancel.cancel();
                }
                () = &mut out_of_time, if time_left.is_some() && !over_time.is_cancelled() => {
                    over_time.cancel();
                }
                () = &mut flush_at, if !flushed => {
                    flushed = true;
                    if !self.flush().await? {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                _ = heartbeat.tick() => {
                    let elapsed_ms = crate::clock::elapsed_ms(started.into_std());
                    let progress = cancel.progress();
                    let beat = EventData::Heartbeat(crate::event::Heartbeat {
                        elapsed_ms,
                        streamed_bytes: progress.streamed_bytes(),
                        tool_calls: progress.tool_calls(),
                    });
                    let event = NewEvent::level(&level_id, attempt, beat);
                    self.stage(vec![event]);
                    if !self.flush().await? {
                        // The log moved under us and the state was re-read: stop the step.
                        cancel.cancel();
                    }
                }
                // What other processes append: a cancel stops the step, a steering message
                // goes to its mailbox. The store's notice, where it gives one, is as good as
                // a poll, sooner.
                () = appended(wake.as_deref()), if self.create.is_none() => {
                    self.look_for_news(cancel, &steering).await?;
                }
                _ = poll.tick(), if polling && self.create.is_none() => {
                    self.look_for_news(cancel, &steering).await?;
                }
            }
        }
    }

    /// Reads what other processes appended since the last stored event: a cancel request
    /// cancels the step, steering messages go to its mailbox.
    async fn look_for_news(
        &mut self,
        cancel: &CancelToken,
        steering: &crate::steering::Mailbox,
    ) -> Result<(), Error> {
        let newer = self.engine.store.load(self.run_id, self.stored_seq).await?;
        for e in &newer {
            match &e.data {
                EventData::CancelRequested(_) => cancel.cancel(),
                EventData::SteeringReceived(m) => steering.post(m),
                _ => {}
            }
        }
        Ok(())
    }

    /// Stages the children's batches still queued when a step stopped, unless it was
    /// cancelled (then the step is dropped whole).
    pub(crate) fn stage_queued(
        &mut self,
        settled: Option<&mut mpsc::Receiver<Vec<NewEvent>>>,
        cancel: &CancelToken,
    ) {
        let Some(settled) = settled else { return };
        while let Ok(batch) = settled.try_recv() {
            if !cancel.is_cancelled() {
                self.stage(batch);
            }
        }
    }
}

/// Resolves when the store says the run was appended to; never without a notifier.
async fn appended(wake: Option<&tokio::sync::Notify>) {
    match wake {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}
