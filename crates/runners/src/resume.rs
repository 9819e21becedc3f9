//! Going through a tool-loop attempt again from its own committed events.
//!
//! A tool loop commits part of its attempt before it is done: each write call's
//! `tool_call_started` (and everything the attempt did before it), and each reaching-out
//! model call's `prompt_sent`. A driver that takes the attempt over after a crash runs the
//! loop again from the last snapshot, but every model answer and every receipt of a tool
//! call comes from those events ([`Resume`]) instead of the world, and every event the
//! loop makes again is checked against the next committed one and not written twice. File
//! tools run again (they are deterministic from the snapshot) so the workspace is as it
//! was. Where the committed events end, the loop acts: a write call started without a
//! receipt is made again with its key (`tool_call_reissued`), and the rest is live. The
//! log of a resumed attempt is then the log an uninterrupted one would have written, but
//! for the reissue.

use std::collections::VecDeque;

use baton_engine::event::{
    Event, EventData, ModelCallFailed, ModelResponse, NewEvent, ToolCallFinished, ToolCallStarted,
    Warning,
};

/// A model call as the committed events have it.
pub(crate) enum RecordedCall {
    /// Its answer, and why it stopped when it says.
    Answered(Box<ModelResponse>, Option<String>),
    /// It failed without an answer.
    Failed(ModelCallFailed),
    /// It was sent (`prompt_sent` is in the log) and the log ends there: make it, without
    /// recording the prompt again.
    Sent,
}

/// A call of a user's tool as the committed events have it.
pub(crate) enum RecordedTool {
    /// Its receipt: the call is answered from it.
    Finished(ToolCallFinished),
    /// Started, and the log ends before its receipt: make it again with this key.
    Started(ToolCallStarted),
}

/// The committed events of the attempt not yet gone through again.
#[derive(Debug, Default)]
pub(crate) struct Resume {
    left: VecDeque<EventData>,
}

impl Resume {
    pub(crate) fn new(resumed: &[Event]) -> Self {
        Resume { left: resumed.iter().map(|e| e.data.clone()).collect() }
    }

    /// Whether every committed event has been gone through: the loop acts from here on.
    pub(crate) fn is_live(&self) -> bool {
        self.left.is_empty()
    }

    /// Stages an event the loop made: dropped when it is the next committed one (it is in
    /// the log already), staged when the committed ones are all gone through. A loop that
    /// makes an event the log does not have next (the scenario or the build changed under
    /// it) stops going through them and says so; what it does from there is live.
    pub(crate) fn emit(&mut self, events: &mut Vec<NewEvent>, event: NewEvent) {
        match self.left.front() {
            None => events.push(event),
            Some(next) if next.kind() == event.data.kind() => {
                self.left.pop_front();
            }
            Some(next) => {
                let message = format!(
                    "the resumed attempt made `{}` where its log holds `{}` next; it goes on live from here",
                    event.data.kind(),
                    next.kind()
                );
                self.left.clear();
                let level_id = event.level_id.clone().unwrap_or_default();
                events.push(NewEvent::level(
                    &level_id,
                    event.attempt.unwrap_or(1),
                    EventData::Warning(Warning { message }),
                ));
                events.push(event);
            }
        }
    }

    /// The next model call of the attempt, when the committed events hold it: what went
    /// with it (its prompt, routing, retries, failovers, a cut) is gone through with it.
    pub(crate) fn model_call(&mut self) -> Option<RecordedCall> {
        let mut sent = false;
        while let Some(next) = self.left.front() {
            match next {
                EventData::PromptSent(_)
                | EventData::RoutingDecision(_)
                | EventData::ProviderRetry(_)
                | EventData::ProviderFailover(_)
                | EventData::ModelCallCut(_)
                | EventData::SteeringReceived(_)
                | EventData::SteeringDelivered(_) => {
                    sent = true;
                    self.left.pop_front();
                }
                EventData::ModelResponse(_) => {
                    let Some(EventData::ModelResponse(response)) = self.left.pop_front() else {
                        unreachable!("the front was a model_response")
                    };
                    let stop = match self.left.front() {
                        Some(EventData::ModelStopped(s)) => {
                            let reason = s.stop_reason.clone();
                            self.left.pop_front();
                            Some(reason)
                        }
                        _ => None,
                    };
                    return Some(RecordedCall::Answered(Box::new(response), stop));
                }
                EventData::ModelCallFailed(_) => {
                    let Some(EventData::ModelCallFailed(failed)) = self.left.pop_front() else {
                        unreachable!("the front was a model_call_failed")
                    };
                    return Some(RecordedCall::Failed(failed));
                }
                _ => break,
            }
        }
        sent.then_some(RecordedCall::Sent)
    }

    /// Goes through a call's approval request and its decision, when they come next.
    pub(crate) fn approval(&mut self) {
        while matches!(
            self.left.front(),
            Some(EventData::ApprovalRequested(_) | EventData::ApprovalDecided(_))
        ) {
            self.left.pop_front();
        }
    }

    /// The next call of a user's tool, when the committed events hold its start or its
    /// receipt (its `tool_call` already gone through).
    pub(crate) fn tool_call(&mut self) -> Option<RecordedTool> {
        match self.left.front()? {
            EventData::ToolCallStarted(_) => {
                let Some(EventData::ToolCallStarted(started)) = self.left.pop_front() else {
                    unreachable!("the front was a tool_call_started")
                };
                // An earlier driver that reissued it and stopped before its receipt: it is
                // reissued again, and said so again.
                while matches!(self.left.front(), Some(EventData::ToolCallReissued(_))) {
                    self.left.pop_front();
                }
                match self.left.front() {
                    Some(EventData::ToolCallFinished(_)) => self.tool_call(),
                    _ => Some(RecordedTool::Started(started)),
                }
            }
            EventData::ToolCallFinished(_) => {
                let Some(EventData::ToolCallFinished(finished)) = self.left.pop_front() else {
                    unreachable!("the front was a tool_call_finished")
                };
                Some(RecordedTool::Finished(finished))
            }
            _ => None,
        }
    }
}
