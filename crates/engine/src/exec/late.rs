//! A level's result that a cancel got in ahead of: dropped like any cut step's work, and,
//! for a wave's worker, said so (`late_result_discarded`), which ends the worker `aborted`
//! (`late_result_after_cancel`) — the reference's late success after an abort.

use super::Writer;
use crate::event::{EventData, NewEvent};

impl Writer<'_> {
    /// After a step's events lost their append to a cancel (the log re-read): stages what
    /// the step's model calls spent, which counts whatever happens to the step, and the
    /// notice of a level's result dropped because the cancel came first when the run is a
    /// wave's worker (the reference's late success after an abort: the worker ends
    /// `aborted`, its assignment `cancelled`).
    pub(crate) fn stage_after_cancel(&mut self, spent: Vec<NewEvent>, late: Option<NewEvent>) {
        if self.state.cancel_requested.is_none() || self.state.status.is_final() {
            return;
        }
        self.stage(spent);
        self.stage_late_result(late);
    }

    /// Stages the notice of a level's result dropped because the run's cancel came first,
    /// when the run is a wave's worker, the log holds that cancel and the run has not ended.
    pub(crate) fn stage_late_result(&mut self, late: Option<NewEvent>) {
        let cancelled = self.state.cancel_requested.is_some()
            && !self.state.status.is_final()
            && self.state.is_wave_worker();
        if let Some(late) = late.filter(|_| cancelled && self.state.late_result.is_none()) {
            self.stage(vec![late]);
        }
    }

    /// The notice of a level's result among `events` (each its level, attempt and payload):
    /// one that ran to a result, not an error nor a skip, for when a cancel got in ahead of it.
    pub(super) fn late_result<'e>(
        events: impl IntoIterator<Item = (Option<&'e str>, Option<u32>, &'e EventData)>,
    ) -> Option<NewEvent> {
        events.into_iter().find_map(|(level_id, attempt, data)| match data {
            EventData::LevelFinished(f) if f.ok && !f.skipped => Some(NewEvent {
                level_id: level_id.map(str::to_owned),
                attempt,
                data: EventData::LateResultDiscarded(crate::event::LateResultDiscarded {
                    verdict: f.verdict.clone(),
                    output_bytes: f.output.len() as u64,
                }),
            }),
            _ => None,
        })
    }
}
